// Embeddings and reranking: one native call evaluates whole inputs, each in its own sequence, with
// the context's pooling, as llama-server's embedding and rerank tasks do (tools/server:
// send_embedding, send_rerank). Runs on the context's runner thread, behind any queued decode step.
#include "hydra_common.h"
#include "llama-model.h"  // cls / cls_out: whether the model has a classification head

#include <cmath>
#include <cstring>

// common_embd_normalize of the pinned common/common.cpp (not linked: the addon compiles in only the
// common/ files it needs). -1 none, 0 max-abs scaled to int16, 2 euclidean, any other p: p-norm (1 is
// taxicab).
static void embd_normalize(const float * inp, float * out, int n, int embd_norm) {
    double sum = 0.0;
    switch (embd_norm) {
        case -1:
            sum = 1.0;
            break;
        case 0:
            for (int i = 0; i < n; i++) {
                if (sum < std::abs(inp[i])) {
                    sum = std::abs(inp[i]);
                }
            }
            sum /= 32760.0;
            break;
        case 2:
            for (int i = 0; i < n; i++) {
                sum += inp[i] * inp[i];
            }
            sum = std::sqrt(sum);
            break;
        default:
            for (int i = 0; i < n; i++) {
                sum += std::pow(std::abs(inp[i]), embd_norm);
            }
            sum = std::pow(sum, 1.0 / embd_norm);
            break;
    }
    const float norm = sum > 0.0 ? 1.0 / sum : 0.0f;
    for (int i = 0; i < n; i++) {
        out[i] = inp[i] * norm;
    }
}

struct embed_entry {
    llama_seq_id seq;
    std::vector<llama_token> tokens;
    std::vector<float> out;  // pooled: n_embd_out (rank: n_cls_out); none: n_tokens x n_embd_out
};

class embed_worker : public Napi::AsyncWorker {
public:
    embed_worker(Napi::Env env, hydra_context * c, Napi::Value ctx_handle, std::vector<embed_entry> entries, int normalize)
        : Napi::AsyncWorker(env), deferred(Napi::Promise::Deferred::New(env)), c(c), entries(std::move(entries)), normalize(normalize) {
        ref = Napi::Persistent(ctx_handle);
    }
    Napi::Promise promise() { return deferred.Promise(); }

    void Execute() override {
        c->runner->run([this] { embed(); });
    }

    // Runner thread. Every token is an output (llama-server's embedding batches); the sequences are
    // emptied before and after, so an input never attends to another's or an earlier request's KV.
    void embed() {
        llama_context * ctx = c->ctx;
        llama_memory_t mem = llama_get_memory(ctx);
        const llama_model * model = llama_get_model(ctx);
        const enum llama_pooling_type pooling = llama_pooling_type(ctx);
        const int32_t n_embd = llama_model_n_embd_out(model);
        const int32_t n_out = pooling == LLAMA_POOLING_TYPE_RANK ? std::max<int32_t>(1, (int32_t) llama_model_n_cls_out(model)) : n_embd;
        llama_batch & batch = c->batch;
        // One KV stream (unified, or one sequence) splits a batch simply, so inputs that fit one
        // ubatch are pooled together. With a stream per sequence llama.cpp splits into ubatches of
        // equal per-sequence length, which would pool inputs of different lengths piecewise: each
        // input then gets its own llama_decode.
        const bool together = llama_n_seq_max(ctx) == 1 || llama_n_ctx_seq(ctx) == llama_n_ctx(ctx);
        // A chain attached for on-device sampling allows one output per sequence (llama.cpp refuses
        // the batch: llama_decode -1), and every token of an input is one: these sequences' chains
        // are dropped (the next decode reserves the graphs again), and from now on the context
        // attaches none to a sequence before it samples (attach_samplers).
        c->embeddings = true;
        for (const embed_entry & e : entries) {
            auto at = c->attached.find(e.seq);
            if (at == c->attached.end()) continue;
            if (at->second.clone != nullptr) {
                llama_set_sampler(ctx, e.seq, nullptr);
                llama_sampler_free(at->second.clone);
            }
            c->attached.erase(at);
        }
        // llama-server turns embeddings on for an embedding batch only; decode steps run without.
        llama_set_embeddings(ctx, true);
        size_t first = 0;
        while (first < entries.size() && failed.empty()) {
            size_t last = together ? entries.size() : first + 1;
            batch.n_tokens = 0;
            for (size_t j = first; j < last; j++) {
                const embed_entry & e = entries[j];
                if (mem) llama_memory_seq_rm(mem, e.seq, -1, -1);
                for (size_t k = 0; k < e.tokens.size(); k++) {
                    int32_t i = batch.n_tokens++;
                    batch.token[i] = e.tokens[k];
                    batch.pos[i] = (llama_pos) k;
                    batch.n_seq_id[i] = 1;
                    batch.seq_id[i][0] = e.seq;
                    batch.logits[i] = true;
                }
            }
            int32_t rc = llama_decode(ctx, batch);
            if (rc != 0) {
                failed = "llama_decode failed with code " + std::to_string(rc);
            } else {
                read(first, last, pooling, n_embd, n_out);
            }
            first = last;
        }
        llama_set_embeddings(ctx, false);
        if (!failed.empty()) SetError(failed);
        if (mem) {
            for (const embed_entry & e : entries) llama_memory_seq_rm(mem, e.seq, -1, -1);
        }
        llama_synchronize(ctx);
    }

    // Copies out the rows of entries [first, last) from the llama_decode that just ran.
    void read(size_t first, size_t last, enum llama_pooling_type pooling, int32_t n_embd, int32_t n_out) {
        llama_context * ctx = c->ctx;
        {
            int32_t at = 0;
            for (size_t j = first; j < last && failed.empty(); j++) {
                embed_entry & e = entries[j];
                if (pooling == LLAMA_POOLING_TYPE_NONE) {
                    e.out.resize(e.tokens.size() * (size_t) n_embd);
                    for (size_t k = 0; k < e.tokens.size(); k++) {
                        const float * row = llama_get_embeddings_ith(ctx, at + (int32_t) k);
                        if (row == nullptr) {
                            failed = "llama.cpp returned no embedding for token " + std::to_string(k) + " of seq " + std::to_string(e.seq);
                            break;
                        }
                        // llama-server normalizes only pooled embeddings.
                        memcpy(e.out.data() + k * n_embd, row, n_embd * sizeof(float));
                    }
                } else {
                    const float * row = llama_get_embeddings_seq(ctx, e.seq);
                    if (row == nullptr) {
                        failed = "llama.cpp returned no pooled embedding for seq " + std::to_string(e.seq);
                        break;
                    }
                    e.out.resize(n_out);
                    if (pooling == LLAMA_POOLING_TYPE_RANK) {
                        memcpy(e.out.data(), row, n_out * sizeof(float));
                    } else {
                        embd_normalize(row, e.out.data(), n_out, normalize);
                    }
                }
                at += (int32_t) e.tokens.size();
            }
        }
    }
    void OnOK() override {
        c->busy = false;
        Napi::Env env = Env();
        Napi::Array list = Napi::Array::New(env, entries.size());
        for (size_t i = 0; i < entries.size(); i++) {
            Napi::Float32Array row = Napi::Float32Array::New(env, entries[i].out.size());
            memcpy(row.Data(), entries[i].out.data(), entries[i].out.size() * sizeof(float));
            list.Set((uint32_t) i, row);
        }
        deferred.Resolve(list);
    }
    void OnError(const Napi::Error & e) override {
        c->busy = false;
        deferred.Reject(hydra_error_make(Env(), HYDRA_ERR_DECODE_FAILED, e.Message()).Value());
    }

private:
    Napi::Promise::Deferred deferred;
    Napi::Reference<Napi::Value> ref;
    hydra_context * c;
    std::vector<embed_entry> entries;
    int normalize;
    std::string failed;
};

// embedBatch(ctx, [{seq, tokens: Int32Array}], normalize) -> Promise<Float32Array[]>
// Every input goes in one llama_decode, so one ubatch must hold them all: with a pooling, a sequence
// split across ubatches would be pooled over its last piece only (why llama-server refuses an input
// longer than n_ubatch).
static Napi::Value embed_batch(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    hydra_context * c = hydra_handle_get<hydra_context>(info[0], "context");
    if (info.Length() < 3 || !info[1].IsArray() || !info[2].IsNumber()) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "embedBatch(ctx, entries, normalize) expected");
    }
    Napi::Array list = info[1].As<Napi::Array>();
    const uint32_t n_seq_max = llama_n_seq_max(c->ctx);
    const uint32_t n_ubatch = llama_n_ubatch(c->ctx);
    std::vector<embed_entry> entries;
    std::vector<bool> seen(n_seq_max, false);
    size_t total = 0;
    for (uint32_t i = 0; i < list.Length(); i++) {
        Napi::Value v = list.Get(i);
        if (!v.IsObject()) {
            hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "an entry of embedBatch must be an object");
        }
        Napi::Object o = v.As<Napi::Object>();
        embed_entry e;
        Napi::Value sv = o.Get("seq");
        e.seq = sv.IsNumber() ? sv.As<Napi::Number>().Int32Value() : -1;
        if (e.seq < 0 || (uint32_t) e.seq >= n_seq_max || seen[e.seq]) {
            hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "seq of an embedBatch entry must be distinct and within 0.." + std::to_string(n_seq_max - 1));
        }
        seen[e.seq] = true;
        Napi::Value tv = o.Get("tokens");
        if (!tv.IsTypedArray() || tv.As<Napi::TypedArray>().TypedArrayType() != napi_int32_array || tv.As<Napi::Int32Array>().ElementLength() == 0) {
            hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "an entry of embedBatch needs tokens (a non-empty Int32Array)");
        }
        Napi::Int32Array t = tv.As<Napi::Int32Array>();
        e.tokens.assign(t.Data(), t.Data() + t.ElementLength());
        const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(c->owner->model));
        for (llama_token tok : e.tokens) {
            if (tok < 0 || tok >= n_vocab) {
                hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "token " + std::to_string(tok) + " is outside 0.." + std::to_string(n_vocab - 1));
            }
        }
        total += e.tokens.size();
        entries.push_back(std::move(e));
    }
    if (entries.empty()) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "embedBatch needs at least one entry");
    }
    if (total > n_ubatch || total > (size_t) c->n_batch) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "embedBatch inputs hold " + std::to_string(total) + " tokens; one ubatch holds " + std::to_string(std::min<uint32_t>(n_ubatch, c->n_batch)));
    }
    if (c->pending > 0) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "context is busy: await its decode steps first");
    }
    bool expected = false;
    if (!c->busy.compare_exchange_strong(expected, true)) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "context is busy with another operation");
    }
    int normalize = info[2].As<Napi::Number>().Int32Value();
    auto * w = new embed_worker(env, c, info[0], std::move(entries), normalize);
    Napi::Promise p = w->promise();
    w->Queue();
    return p;
}

// embedInfo(ctx) -> {poolingType, nEmbdOut, nClsOut, hasRankHead, rerank prompt pieces}
static Napi::Value embed_info(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    hydra_context * c = hydra_handle_get<hydra_context>(info[0], "context");
    const llama_model * model = c->owner->model;
    const char * names[] = {"none", "mean", "cls", "last", "rank"};
    const enum llama_pooling_type p = llama_pooling_type(c->ctx);
    Napi::Object out = Napi::Object::New(env);
    out.Set("poolingType", p >= 0 && p <= LLAMA_POOLING_TYPE_RANK ? names[p] : "unspecified");
    out.Set("nEmbdOut", llama_model_n_embd_out(model));
    out.Set("nClsOut", llama_model_n_cls_out(model));
    // Without cls / cls_out tensors, rank pooling returns the first element of the pooled hidden
    // state as a "score": the engine refuses --reranking on such a model instead.
    out.Set("hasRankHead", model->cls != nullptr || model->cls_out != nullptr);
    // What format_prompt_rerank (tools/server/server-common.cpp) builds a query/document pair from.
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const char * rerank = llama_model_chat_template(model, "rerank");
    out.Set("rerankTemplate", rerank != nullptr ? Napi::Value(Napi::String::New(env, rerank)) : env.Null());
    out.Set("addBos", llama_vocab_get_add_bos(vocab));
    out.Set("addEos", llama_vocab_get_add_eos(vocab));
    out.Set("addSep", llama_vocab_get_add_sep(vocab));
    out.Set("bos", llama_vocab_bos(vocab));
    out.Set("eos", llama_vocab_eos(vocab));
    out.Set("sep", llama_vocab_sep(vocab));
    return out;
}

void hydra_embed_init(Napi::Env env, Napi::Object exports) {
    exports.Set("embedBatch", Napi::Function::New(env, embed_batch));
    exports.Set("embedInfo", Napi::Function::New(env, embed_info));
}
