// Draft-free speculation: upstream's ngram-map-k, ngram-map-k4v, ngram-mod and ngram-cache drafters
// (common/ngram-map.cpp, ngram-mod.cpp and ngram-cache.cpp of the pinned tree, compiled in). The
// per-sequence state and the begin/draft/accept steps follow common/speculative.cpp's impl structs
// of the same names; common_speculative itself is not used because it also owns draft contexts and
// mirrors batches (see hydra_draft.cpp). A drafter is looked up on the JS thread: each call is a
// bounded scan of the history or a hash lookup, the same work upstream's server does inline.
#include "hydra_common.h"
#include "log.h"
#include "ngram-cache.h"
#include "ngram-map.h"
#include "ngram-mod.h"

#include <memory>
#include <mutex>

namespace {

enum class ngram_kind { map_k, map_k4v, mod, cache };

struct mod_seq {
    size_t i_last = 0;        // last prompt position added to the shared hash
    size_t n_draft_last = 0;  // length of the last draft, for the acceptance streak
    int    n_low = 0;         // consecutive drafts with acceptance below 0.25
};

struct cache_seq {
    size_t cache_size = 0;  // tokens of the history already in the context cache
    common_ngram_cache context;
    common_ngram_cache dynamic;
    common_ngram_cache statics;
};

struct hydra_ngram {
    ngram_kind kind;
    std::vector<common_ngram_map> maps;  // map_k / map_k4v: one per sequence
    std::unique_ptr<common_ngram_mod> mod;  // mod: one hash shared by every sequence, as upstream
    int32_t mod_n_max = 0, mod_n_min = 0;
    std::vector<mod_seq> mseq;
    std::vector<cache_seq> cseq;
};

// Upstream's fixed ngram-cache draft length (create_state_ngram_cache).
constexpr int CACHE_N_DRAFT = 8;
// ngram-mod's hash size and the occupancy past which begin() resets it (common/speculative.cpp).
constexpr size_t MOD_SIZE = 4 * 1024 * 1024;
constexpr double MOD_OCCUPANCY_RESET = 0.25;

void ngram_destroy(hydra_ngram * g) { delete g; }

// ngram-map's LOG_INF lines (a map refresh at each request) would go to stdout through common's
// logger thread; the engine owns its output (hydra_chat.cpp quiets it the same way).
void quiet_common_log() {
    static std::once_flag once;
    std::call_once(once, [] {
        common_log_set_verbosity_thold(-1);
        common_log_pause(common_log_main());
    });
}

hydra_ngram * ngram_get(const Napi::Value & v) { return hydra_handle_get<hydra_ngram>(v, "ngram drafter"); }

llama_tokens tokens_of(const Napi::Value & v) {
    if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_int32_array) {
        hydra_error_throw(v.Env(), HYDRA_ERR_BAD_ARGUMENT, "tokens must be an Int32Array");
    }
    auto a = v.As<Napi::Int32Array>();
    return llama_tokens(a.Data(), a.Data() + a.ElementLength());
}

size_t seq_of(hydra_ngram * g, const Napi::Value & v) {
    const size_t n = g->kind == ngram_kind::mod ? g->mseq.size() : g->kind == ngram_kind::cache ? g->cseq.size() : g->maps.size();
    const double s = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
    if (!(s >= 0 && s < (double) n)) {
        hydra_error_throw(v.Env(), HYDRA_ERR_BAD_ARGUMENT, "seq out of range");
    }
    return (size_t) s;
}

uint16_t u16_of(const Napi::Object & o, const char * key, int lo) {
    Napi::Value v = o.Get(key);
    const double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
    if (!(d >= lo && d <= 1024) || d != (double) (int) d) {
        hydra_error_throw(o.Env(), HYDRA_ERR_BAD_ARGUMENT, std::string(key) + " must be an integer in [" + std::to_string(lo) + ", 1024]");
    }
    return (uint16_t) d;
}

// ngramCreate(type, params, nSeq) -> handle. type: ngram_map_k | ngram_map_k4v | ngram_mod | ngram_cache;
// params: {sizeN, sizeM, minHits} for the maps, {nMatch, nMax, nMin} for ngram_mod.
Napi::Value ngram_create(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    const std::string type = info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : "";
    Napi::Object p = info[1].IsObject() ? info[1].As<Napi::Object>() : Napi::Object::New(env);
    const double n_seq = info[2].IsNumber() ? info[2].As<Napi::Number>().DoubleValue() : 0;
    if (!(n_seq >= 1 && n_seq <= 4096)) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "nSeq must be in [1, 4096]");
    }
    quiet_common_log();
    auto g = std::make_unique<hydra_ngram>();
    if (type == "ngram_map_k" || type == "ngram_map_k4v") {
        g->kind = type == "ngram_map_k" ? ngram_kind::map_k : ngram_kind::map_k4v;
        const uint16_t n = u16_of(p, "sizeN", 1), m = u16_of(p, "sizeM", 1), hits = u16_of(p, "minHits", 1);
        for (int i = 0; i < (int) n_seq; i++) {
            g->maps.emplace_back(n, m, g->kind == ngram_kind::map_k, hits);
        }
    } else if (type == "ngram_mod") {
        g->kind = ngram_kind::mod;
        g->mod = std::make_unique<common_ngram_mod>(u16_of(p, "nMatch", 1), MOD_SIZE);
        g->mod_n_max = u16_of(p, "nMax", 0);
        g->mod_n_min = u16_of(p, "nMin", 0);
        g->mseq.resize((size_t) n_seq);
    } else if (type == "ngram_cache") {
        g->kind = ngram_kind::cache;
        g->cseq.resize((size_t) n_seq);
    } else {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "unknown ngram drafter type '" + type + "'");
    }
    auto ** slot = new hydra_ngram *(g.release());
    return Napi::External<hydra_ngram *>::New(env, slot, [](Napi::Env, hydra_ngram ** s) {
        ngram_destroy(*s);
        delete s;
    });
}

Napi::Value ngram_free(const Napi::CallbackInfo & info) {
    if (info[0].IsExternal()) {
        auto ** slot = info[0].As<Napi::External<hydra_ngram *>>().Data();
        if (slot != nullptr && *slot != nullptr) {
            delete *slot;
            *slot = nullptr;
        }
    }
    return info.Env().Undefined();
}

// ngramBegin(h, seq, prompt): a new generation on `seq` starts after `prompt`.
Napi::Value ngram_begin(const Napi::CallbackInfo & info) {
    hydra_ngram * g = ngram_get(info[0]);
    const size_t seq = seq_of(g, info[1]);
    const llama_tokens prompt = tokens_of(info[2]);
    switch (g->kind) {
        case ngram_kind::map_k:
        case ngram_kind::map_k4v: common_ngram_map_begin(g->maps[seq], prompt); break;
        case ngram_kind::mod: {
            auto & s = g->mseq[seq];
            s.i_last = 0;
            s.n_draft_last = 0;
            const size_t n = g->mod->get_n();
            if (prompt.size() < n) {
                break;
            }
            for (size_t i = 0; i < prompt.size() - n; ++i) {
                g->mod->add(prompt.data() + i);
            }
            s.i_last = prompt.size() - n;
            if ((double) g->mod->get_used() / (double) g->mod->size() > MOD_OCCUPANCY_RESET) {
                g->mod->reset();
            }
            break;
        }
        case ngram_kind::cache:
            // Upstream's begin is a no-op and its context cache grows from where it was; a slot here
            // serves unrelated requests in turn, so the new request's history starts a new cache.
            g->cseq[seq] = cache_seq{};
            break;
    }
    return info.Env().Undefined();
}

void mod_draft(hydra_ngram * g, mod_seq & s, const llama_tokens & prompt, llama_token id_last, llama_tokens & result) {
    auto & mod = *g->mod;
    s.n_draft_last = 0;
    const size_t cur_len = prompt.size();
    const size_t n = mod.get_n();
    if (cur_len < n) {
        return;
    }
    if (s.i_last + 32 < cur_len) {
        for (size_t i = s.i_last; i < cur_len - n; ++i) {
            mod.add(prompt.data() + i);
        }
        s.i_last = cur_len - n;
    }
    result.resize(n + g->mod_n_max);
    for (size_t i = 0; i < n - 1; ++i) {
        result[i] = prompt.at(cur_len - n + 1 + i);
    }
    result[n - 1] = id_last;
    for (int i = 0; i < g->mod_n_max; ++i) {
        const llama_token token = mod.get(result.data() + i);
        if (token == common_ngram_mod::EMPTY) {
            if (i < g->mod_n_min) {
                result.clear();
                return;
            }
            result.resize(n + i);
            break;
        }
        result[n + i] = token;
    }
    result.erase(result.begin(), result.begin() + (ptrdiff_t) n);
    s.n_draft_last = result.size();
}

void cache_draft(cache_seq & s, const llama_tokens & prompt, llama_token id_last, llama_tokens & result) {
    llama_tokens inp = prompt;
    inp.push_back(id_last);
    if (s.cache_size < inp.size()) {
        // The whole history with the count of new tokens, as common_ngram_cache_update means it (and
        // examples/lookup calls it). Upstream's speculative.cpp passes only the new tokens, so after
        // the first call (one token a step) no n-gram of the generated text ever reaches the cache.
        common_ngram_cache_update(s.context, LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX, inp, (int) (inp.size() - s.cache_size), false);
        s.cache_size = inp.size();
    }
    result.push_back(id_last);
    common_ngram_cache_draft(inp, result, CACHE_N_DRAFT, LLAMA_NGRAM_MIN, LLAMA_NGRAM_MAX, s.context, s.dynamic, s.statics);
    result.erase(result.begin());
}

// ngramDraft(h, seq, history, limit) -> Int32Array: the guess after `history`, whose last token is
// the one just sampled (upstream's id_last; the rest is its prompt), truncated to `limit` as
// common_speculative_draft truncates to n_max.
Napi::Value ngram_draft(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    hydra_ngram * g = ngram_get(info[0]);
    const size_t seq = seq_of(g, info[1]);
    llama_tokens prompt = tokens_of(info[2]);
    const double limit = info[3].IsNumber() ? info[3].As<Napi::Number>().DoubleValue() : 0;
    llama_tokens result;
    if (!prompt.empty() && limit >= 1) {
        const llama_token id_last = prompt.back();
        prompt.pop_back();
        switch (g->kind) {
            case ngram_kind::map_k:
            case ngram_kind::map_k4v: common_ngram_map_draft(g->maps[seq], prompt, id_last, result); break;
            case ngram_kind::mod: mod_draft(g, g->mseq[seq], prompt, id_last, result); break;
            case ngram_kind::cache: cache_draft(g->cseq[seq], prompt, id_last, result); break;
        }
        if (result.size() > (size_t) limit) {
            result.resize((size_t) limit);
        }
    }
    auto out = Napi::Int32Array::New(env, result.size());
    std::copy(result.begin(), result.end(), out.Data());
    return out;
}

// ngramAccept(h, seq, nAccepted): how many tokens of the last non-empty draft the target confirmed.
Napi::Value ngram_accept(const Napi::CallbackInfo & info) {
    hydra_ngram * g = ngram_get(info[0]);
    const size_t seq = seq_of(g, info[1]);
    const double d = info[2].IsNumber() ? info[2].As<Napi::Number>().DoubleValue() : -1;
    if (!(d >= 0 && d <= 65535)) {
        hydra_error_throw(info.Env(), HYDRA_ERR_BAD_ARGUMENT, "nAccepted must be in [0, 65535]");
    }
    const uint16_t n_accepted = (uint16_t) d;
    switch (g->kind) {
        case ngram_kind::map_k:
        case ngram_kind::map_k4v: common_ngram_map_accept(g->maps[seq], n_accepted); break;
        case ngram_kind::mod: {
            auto & s = g->mseq[seq];
            if (s.n_draft_last > 0) {
                if ((double) n_accepted / (double) s.n_draft_last < 0.25) {
                    if (++s.n_low >= 5) {
                        g->mod->reset();
                        s.n_low = 0;
                        s.i_last = 0;
                    }
                } else {
                    s.n_low = 0;
                }
            }
            break;
        }
        case ngram_kind::cache: break;
    }
    return info.Env().Undefined();
}

}  // namespace

void hydra_ngram_init(Napi::Env env, Napi::Object exports) {
    exports.Set("ngramCreate", Napi::Function::New(env, ngram_create));
    exports.Set("ngramFree", Napi::Function::New(env, ngram_free));
    exports.Set("ngramBegin", Napi::Function::New(env, ngram_begin));
    exports.Set("ngramDraft", Napi::Function::New(env, ngram_draft));
    exports.Set("ngramAccept", Napi::Function::New(env, ngram_accept));
}
