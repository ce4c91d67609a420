// Speculative decoding with a draft model: upstream's draft-simple (common/speculative.cpp of the
// pinned tree) over a hydra_context of the draft model. The draft's KV mirrors each target slot's
// tokens; the caller (the engine's scheduler) feeds what the draft has not seen, this runs the
// greedy draft loop on the draft context's runner thread, and the target verifies the guesses in
// its own batched step. common_speculative itself is not used: it owns its contexts and mirrors the
// target's batches through its own process(), while here both contexts are the binding's.
#include "hydra_common.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace {

// Upstream's limits for a compatible vocabulary (common/speculative.cpp).
constexpr int SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128;
constexpr int SPEC_VOCAB_CHECK_START_TOKEN_ID = 5;
// Upstream drafts with a top-k(10) chain and reads the first candidate's probability among them.
constexpr int DRAFT_TOP_K = 10;

// common_speculative_are_compatible, with the reason instead of a log line ("" when compatible).
std::string vocab_mismatch(const llama_model * tgt, const llama_model * dft) {
    const llama_vocab * vt = llama_model_get_vocab(tgt);
    const llama_vocab * vd = llama_model_get_vocab(dft);
    if (llama_vocab_type(vt) != llama_vocab_type(vd)) {
        return "vocab type " + std::to_string(llama_vocab_type(vd)) + " differs from the target's " + std::to_string(llama_vocab_type(vt));
    }
    if (llama_vocab_get_add_bos(vt) != llama_vocab_get_add_bos(vd) || (llama_vocab_get_add_bos(vt) && llama_vocab_bos(vt) != llama_vocab_bos(vd))) {
        return "BOS token " + std::to_string(llama_vocab_bos(vd)) + " (add " + std::to_string(llama_vocab_get_add_bos(vd)) + ") differs from the target's " +
               std::to_string(llama_vocab_bos(vt)) + " (add " + std::to_string(llama_vocab_get_add_bos(vt)) + ")";
    }
    if (llama_vocab_get_add_eos(vt) != llama_vocab_get_add_eos(vd) || (llama_vocab_get_add_eos(vt) && llama_vocab_eos(vt) != llama_vocab_eos(vd))) {
        return "EOS token " + std::to_string(llama_vocab_eos(vd)) + " differs from the target's " + std::to_string(llama_vocab_eos(vt));
    }
    const int nt = llama_vocab_n_tokens(vt);
    const int nd = llama_vocab_n_tokens(vd);
    if (std::abs(nt - nd) > SPEC_VOCAB_MAX_SIZE_DIFFERENCE) {
        return "vocab size " + std::to_string(nd) + " differs from the target's " + std::to_string(nt) + " by more than " +
               std::to_string(SPEC_VOCAB_MAX_SIZE_DIFFERENCE);
    }
    for (int i = SPEC_VOCAB_CHECK_START_TOKEN_ID; i < std::min(nt, nd); i++) {
        if (std::strcmp(llama_vocab_get_text(vt, i), llama_vocab_get_text(vd, i)) != 0) {
            return "token " + std::to_string(i) + " is '" + llama_vocab_get_text(vd, i) + "', the target's '" + llama_vocab_get_text(vt, i) + "'";
        }
    }
    return "";
}

// draftVocabMismatch(target, draft) -> string: why the draft cannot draft for the target, or "".
Napi::Value draft_vocab_mismatch(const Napi::CallbackInfo & info) {
    hydra_model * tgt = hydra_handle_get<hydra_model>(info[0], "model");
    hydra_model * dft = hydra_handle_get<hydra_model>(info[1], "model");
    return Napi::String::New(info.Env(), vocab_mismatch(tgt->model, dft->model));
}

struct draft_entry {
    llama_seq_id seq;
    llama_pos pos;                    // position of tokens[0]
    std::vector<llama_token> tokens;  // what the draft's KV lacks, ending with the token just sampled
    int32_t n_max;
    std::vector<llama_token> result;
    int32_t fed = 0;                  // guesses decoded into the KV (the last guess is not)
    bool stopped = false;             // its last candidate was below p_min
};

// The first candidate of a top-k(10) chain and its probability among those 10 (upstream's p).
std::pair<llama_token, float> top_candidate(const float * logits, int32_t n_vocab) {
    std::vector<std::pair<float, llama_token>> top;
    top.reserve(DRAFT_TOP_K + 1);
    for (llama_token t = 0; t < n_vocab; t++) {
        float l = logits[t];
        if ((int) top.size() == DRAFT_TOP_K && l <= top.back().first) {
            continue;
        }
        // Ties keep the lower id first, as llama.cpp's sort of candidates by logit does.
        auto at = std::upper_bound(top.begin(), top.end(), std::make_pair(l, t), [](const auto & a, const auto & b) { return a.first > b.first; });
        top.insert(at, {l, t});
        if ((int) top.size() > DRAFT_TOP_K) {
            top.pop_back();
        }
    }
    double sum = 0;
    for (const auto & c : top) {
        sum += std::exp((double) c.first - (double) top[0].first);
    }
    return {top[0].second, (float) (1.0 / sum)};
}

class draft_job {
public:
    draft_job(Napi::Env env, hydra_context * c, std::vector<draft_entry> entries, int32_t n_min, float p_min, Napi::Reference<Napi::Value> ref)
        : deferred(Napi::Promise::Deferred::New(env)), c(c), entries(std::move(entries)), n_min(n_min), p_min(p_min), ref(std::move(ref)) {}
    Napi::Promise promise() { return deferred.Promise(); }

    // Runner thread: feed each entry's tokens (chunked to n_batch), then draft greedily in steps
    // that carry one token of every sequence still drafting, as upstream's draft() does.
    void execute() {
        llama_batch & batch = c->batch;
        const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(c->owner->model));
        size_t entry = 0, offset = 0;
        while (entry < entries.size()) {
            batch.n_tokens = 0;
            std::vector<std::pair<size_t, int32_t>> last;
            while (entry < entries.size() && batch.n_tokens < c->n_batch) {
                draft_entry & e = entries[entry];
                size_t take = std::min(e.tokens.size() - offset, (size_t) (c->n_batch - batch.n_tokens));
                for (size_t k = 0; k < take; k++) {
                    int32_t i = batch.n_tokens++;
                    bool is_last = offset + k + 1 == e.tokens.size();
                    batch.token[i] = e.tokens[offset + k];
                    batch.pos[i] = e.pos + (llama_pos) (offset + k);
                    batch.n_seq_id[i] = 1;
                    batch.seq_id[i][0] = e.seq;
                    batch.logits[i] = is_last;
                    if (is_last) {
                        last.emplace_back(entry, i);
                    }
                }
                offset += take;
                if (offset == e.tokens.size()) {
                    entry++;
                    offset = 0;
                }
            }
            if (!decode()) {
                return;
            }
            // The chunk's logits are overwritten by the next one: take the first guesses now.
            for (auto [index, i] : last) {
                guess(index, llama_get_logits_ith(c->ctx, i), n_vocab);
            }
        }
        for (;;) {
            batch.n_tokens = 0;
            std::vector<size_t> in_batch;
            for (size_t k = 0; k < entries.size(); k++) {
                draft_entry & e = entries[k];
                if (!drafting(e)) {
                    continue;
                }
                int32_t i = batch.n_tokens++;
                batch.token[i] = e.result.back();
                batch.pos[i] = e.pos + (llama_pos) e.tokens.size() + e.fed;
                batch.n_seq_id[i] = 1;
                batch.seq_id[i][0] = e.seq;
                batch.logits[i] = true;
                e.fed++;
                in_batch.push_back(k);
            }
            if (batch.n_tokens == 0) {
                break;
            }
            if (!decode()) {
                return;
            }
            for (size_t j = 0; j < in_batch.size(); j++) {
                guess(in_batch[j], llama_get_logits_ith(c->ctx, (int32_t) j), n_vocab);
            }
        }
        for (draft_entry & e : entries) {
            if ((int32_t) e.result.size() < n_min) {
                e.result.clear();
            }
        }
    }

    static void settle(Napi::Env env, Napi::Function, draft_job * job) {
        hydra_context * c = job->c;
        if (env != nullptr) {
            if (--c->pending == 0) {
                c->done.Unref(env);
            }
            if (job->failed.empty()) {
                Napi::Array out = Napi::Array::New(env, job->entries.size());
                for (size_t i = 0; i < job->entries.size(); i++) {
                    const draft_entry & e = job->entries[i];
                    Napi::Object o = Napi::Object::New(env);
                    Napi::Int32Array t = Napi::Int32Array::New(env, e.result.size());
                    if (!e.result.empty()) {
                        memcpy(t.Data(), e.result.data(), e.result.size() * sizeof(llama_token));
                    }
                    o.Set("tokens", t);
                    o.Set("fed", Napi::Number::New(env, e.fed));
                    out.Set((uint32_t) i, o);
                }
                job->deferred.Resolve(out);
            } else {
                job->deferred.Reject(hydra_error_make(env, HYDRA_ERR_DECODE_FAILED, job->failed).Value());
            }
        }
        delete job;
    }

private:
    // Still drafting: its last guess was confident enough and it wants more.
    bool drafting(const draft_entry & e) const {
        return !e.result.empty() && !e.stopped && (int32_t) e.result.size() < e.n_max;
    }

    void guess(size_t index, const float * logits, int32_t n_vocab) {
        draft_entry & e = entries[index];
        if (e.n_max <= 0 || e.stopped) {
            return;
        }
        auto [token, p] = top_candidate(logits, n_vocab);
        // Only very confident guesses are kept (upstream: "only collect very high-confidence draft tokens").
        if (p < p_min) {
            e.stopped = true;
            return;
        }
        e.result.push_back(token);
    }

    bool decode() {
        int32_t rc = llama_decode(c->ctx, c->batch);
        if (rc != 0) {
            failed = rc == 1 ? "the draft context has no KV room for this batch" : "draft llama_decode failed with code " + std::to_string(rc);
            return false;
        }
        return true;
    }

    Napi::Promise::Deferred deferred;
    hydra_context * c;
    std::vector<draft_entry> entries;
    int32_t n_min;
    float p_min;
    Napi::Reference<Napi::Value> ref;  // keeps the draft context alive
    std::string failed;
};

// draftGenerate(ctx, [{seq, pos, tokens: Int32Array, nMax}], nMin, pMin) -> Promise<[{tokens, fed}]>
Napi::Value draft_generate(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    hydra_context * c = hydra_handle_get<hydra_context>(info[0], "context");
    Napi::Array list = info[1].As<Napi::Array>();
    int32_t n_min = info[2].ToNumber().Int32Value();
    float p_min = info[3].ToNumber().FloatValue();
    uint32_t n_seq_max = llama_n_seq_max(c->ctx);
    std::vector<draft_entry> entries;
    for (uint32_t i = 0; i < list.Length(); i++) {
        Napi::Object o = list.Get(i).As<Napi::Object>();
        draft_entry e;
        e.seq = o.Get("seq").ToNumber().Int32Value();
        e.pos = o.Get("pos").ToNumber().Int32Value();
        e.n_max = o.Get("nMax").ToNumber().Int32Value();
        Napi::Value tv = o.Get("tokens");
        if (e.seq < 0 || (uint32_t) e.seq >= n_seq_max || e.pos < 0 || e.n_max < 0 || !tv.IsTypedArray() ||
            tv.As<Napi::TypedArray>().TypedArrayType() != napi_int32_array || tv.As<Napi::Int32Array>().ElementLength() == 0) {
            hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "a draftGenerate entry needs seq in 0.." + std::to_string(n_seq_max - 1) + ", pos >= 0, nMax >= 0 and an Int32Array of tokens");
        }
        Napi::Int32Array t = tv.As<Napi::Int32Array>();
        e.tokens.assign(t.Data(), t.Data() + t.ElementLength());
        for (size_t k = 0; k < entries.size(); k++) {
            if (entries[k].seq == e.seq) {
                hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "seq " + std::to_string(e.seq) + " appears twice in one draftGenerate call");
            }
        }
        entries.push_back(std::move(e));
    }
    if ((int32_t) entries.size() > c->n_batch) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "draftGenerate: more sequences than the draft context's n_batch");
    }
    if (c->busy.load()) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "context is busy with another operation");
    }
    auto * job = new draft_job(env, c, std::move(entries), n_min, p_min, Napi::Persistent(info[0]));
    Napi::Promise p = job->promise();
    if (c->pending++ == 0) {
        c->done.Ref(env);
    }
    c->runner->post([c, job] {
        job->execute();
        c->done.BlockingCall(job, draft_job::settle);
    });
    return p;
}

}  // namespace

void hydra_draft_init(Napi::Env env, Napi::Object exports) {
    exports.Set("draftVocabMismatch", Napi::Function::New(env, draft_vocab_mismatch));
    exports.Set("draftGenerate", Napi::Function::New(env, draft_generate));
}
