// Greedy sampling on the device in two stages, as a custom llama.cpp sampler (public sampler API, no
// upstream patch). Upstream's backend greedy is one ggml_argmax over the whole vocabulary row, and
// ggml-cuda runs an argmax row in a single block of threads: one SM walks 128k logits alone, which
// on the H200 left greedy decode about 2% behind llama-bench (whose tg copies the logits and samples
// nothing). Here the row is viewed as R rows of C logits (C * R = n_vocab): argmax per row runs R
// blocks at once, then the winner among the R row maxima is picked and mapped back to a token id.
// All ops are plain ggml (argmax, get_rows, arange, cast), so every backend that has them runs it.
//
//   logits [V] -> [C, R] --argmax--> idx [R] --get_rows--> row maxima [R] --argmax--> r
//   arange(V) -> [1, C, R] --get_rows(idx)--> ids of the row maxima [R] --get_rows(r)--> token
//
// Ties within a row break as the backend's argmax breaks them (the CPU's: the first index); across
// rows, the first row wins, so on the CPU this is exactly the first index of the largest logit.

#include "hydra_common.h"

#include "ggml-backend.h"
#include "ggml.h"

#include <cmath>
#include <cstdlib>

namespace {

struct hydra_greedy {
    int64_t n_vocab;
};

// The divisor of n_vocab closest to 1024 (rows of about a block's width: 128256 = 1002 x 128,
// 152064 = 1056 x 144), leaving at least two rows. 0 when none lies in [8, 8192].
int64_t split_cols(int64_t n_vocab) {
    int64_t best = 0;
    for (int64_t c = 8; c <= 8192 && c * 2 <= n_vocab; c++) {
        if (n_vocab % c == 0 && (best == 0 || std::llabs(c - 1024) < std::llabs(best - 1024))) {
            best = c;
        }
    }
    return best;
}

// The split is chosen from the row's own length: llama.cpp also builds this graph on a probe row of
// another length to count its nodes, and the count must match the real graph's.
ggml_tensor * greedy_build(ggml_context * ctx, ggml_tensor * logits) {
    const int64_t n = ggml_nelements(logits);
    const int64_t cols = split_cols(n);
    ggml_tensor * flat = ggml_reshape_1d(ctx, logits, n);
    if (cols == 0) {
        return ggml_argmax(ctx, flat);
    }
    const int64_t rows = n / cols;
    ggml_tensor * idx = ggml_argmax(ctx, ggml_reshape_2d(ctx, flat, cols, rows));     // i32 [R]
    ggml_tensor * pick = ggml_reshape_2d(ctx, idx, 1, rows);                          // one row per batch
    ggml_tensor * maxima = ggml_get_rows(ctx, ggml_reshape_3d(ctx, flat, 1, cols, rows), pick);
    ggml_tensor * winner = ggml_argmax(ctx, ggml_reshape_2d(ctx, maxima, rows, 1));  // i32 [1]
    ggml_tensor * ids = ggml_arange(ctx, 0.0f, (float) n, 1.0f);                      // exact below 2^24
    ggml_tensor * row_ids = ggml_get_rows(ctx, ggml_reshape_3d(ctx, ids, 1, cols, rows), pick);
    ggml_tensor * token = ggml_get_rows(ctx, ggml_reshape_2d(ctx, row_ids, 1, rows), winner);
    return ggml_cast(ctx, ggml_reshape_1d(ctx, token, 1), GGML_TYPE_I32);
}

const char * greedy_name(const llama_sampler *) {
    return "hydra-greedy";
}

void greedy_apply(llama_sampler *, llama_token_data_array * cur_p) {
    // The CPU path (when the chain is not on the device): the first index of the largest logit.
    cur_p->selected = 0;
    for (size_t i = 1; i < cur_p->size; i++) {
        if (cur_p->data[i].logit > cur_p->data[cur_p->selected].logit) {
            cur_p->selected = (int64_t) i;
        }
    }
}

llama_sampler * greedy_clone(const llama_sampler * smpl);

void greedy_free(llama_sampler * smpl) {
    delete (hydra_greedy *) smpl->ctx;
}

// Runs on the device only if the device has every op of the graph this sampler builds.
bool greedy_backend_init(llama_sampler * smpl, ggml_backend_buffer_type_t buft, uint32_t n_outputs_max_per_seq) {
    (void) n_outputs_max_per_seq;
    const auto * g = (const hydra_greedy *) smpl->ctx;
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    if (dev == nullptr) {
        return true;
    }
    ggml_init_params params = {64 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(params);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, greedy_build(ctx, ggml_new_tensor_1d(ctx, GGML_TYPE_F32, g->n_vocab)));
    bool ok = true;
    for (int i = 0; i < ggml_graph_n_nodes(gf) && ok; i++) {
        ok = ggml_backend_dev_supports_op(dev, ggml_graph_node(gf, i));
    }
    ggml_free(ctx);
    return ok;
}

void greedy_backend_apply(llama_sampler *, ggml_context * ctx, ggml_cgraph *, llama_sampler_data * data) {
    data->sampled = greedy_build(ctx, data->logits);
}

void greedy_copy_state(const llama_sampler *, llama_sampler *) {}  // no mutable state

llama_sampler_i greedy_iface = {
    /* .name              = */ greedy_name,
    /* .accept            = */ nullptr,
    /* .apply             = */ greedy_apply,
    /* .reset             = */ nullptr,
    /* .clone             = */ greedy_clone,
    /* .free              = */ greedy_free,
    /* .backend_init      = */ greedy_backend_init,
    /* .backend_accept    = */ nullptr,
    /* .backend_apply     = */ greedy_backend_apply,
    /* .backend_set_input = */ nullptr,
    /* .backend_reset     = */ nullptr,
    /* .copy_state        = */ greedy_copy_state,
};

llama_sampler * greedy_clone(const llama_sampler * smpl) {
    const auto * g = (const hydra_greedy *) smpl->ctx;
    return llama_sampler_init(&greedy_iface, new hydra_greedy(*g));
}

}  // namespace

llama_sampler * hydra_greedy_init(int32_t n_vocab) {
    return llama_sampler_init(&greedy_iface, new hydra_greedy{n_vocab});
}
