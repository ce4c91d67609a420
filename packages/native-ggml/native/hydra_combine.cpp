// COMBINE support: the weights index that lets a peer answer ggml-RPC SET_TENSOR_HASH from its own
// copy of the GGUF, and the park-instead-of-abort hook that lets a head outlive a lost peer.
//
// Why hashes and not names: upstream's client already sends RPC_CMD_SET_TENSOR_HASH (FNV-1a 64 of
// the bytes) instead of the bytes for every tensor above HASH_THRESHOLD, and only sends the data
// when the server answers "not cached". Answering that command from the GGUF the peer holds needs
// no protocol change and no client change: a stock upstream client gets the saving from our peer,
// and a stock server (no index) just answers "not cached" to our head, which then sends the bytes.
// Resolving by tensor name would need a new command (both ends ours) and trusts that both files
// are the same; a 64-bit hash of the content checks that for free.
#include "hydra_common.h"

#include "ggml.h"
#include "ggml-rpc.h"
#include "gguf.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

// Upstream's client hashes only tensors larger than this (HASH_THRESHOLD in ggml-rpc.cpp, not
// exported); smaller ones always travel as bytes, so hashing them would be wasted work.
static constexpr size_t k_hash_threshold = 10 * 1024 * 1024;

// Same function and seed as upstream's fnv_hash: the hash the client puts on the wire.
static uint64_t fnv1a64(const uint8_t * data, size_t len) {
    uint64_t hash = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++) {
        hash ^= data[i];
        hash *= 0x100000001b3ULL;
    }
    return hash;
}

struct weights_region {
    const uint8_t * data;
    size_t          size;
};

// Process-wide and append-only: every serving worker thread reads it, regions point into read-only
// mappings that live as long as the process (the page cache is shared with the engine's own mmap
// of the same file, so the index costs no memory beyond the table).
static std::shared_mutex                                  g_index_mutex;
static std::unordered_map<uint64_t, weights_region>      g_index;
static std::unordered_set<std::string>                   g_index_files;
static std::atomic<uint64_t>                              g_index_bytes{0};
static std::atomic<uint64_t>                              g_resolve_hits{0};

const void * hydra_weights_resolve(void * /*user_data*/, uint64_t hash, size_t * size) {
    std::shared_lock<std::shared_mutex> lock(g_index_mutex);
    auto it = g_index.find(hash);
    if (it == g_index.end()) {
        return nullptr;
    }
    *size = it->second.size;
    g_resolve_hits++;
    return it->second.data;
}

struct index_result {
    std::string file;
    uint32_t    tensors = 0;
    uint32_t    indexed = 0;
    uint64_t    bytes = 0;
    double      ms = 0;
    bool        already = false;
};

class index_worker : public Napi::AsyncWorker {
public:
    index_worker(Napi::Env env, std::string path) : Napi::AsyncWorker(env), path(std::move(path)), deferred(env) {}
    Napi::Promise promise() { return deferred.Promise(); }

    void Execute() override {
        auto started = std::chrono::steady_clock::now();
        char real[PATH_MAX];
        if (realpath(path.c_str(), real) == nullptr) {
            fail(HYDRA_ERR_LOAD_FAILED, "cannot open " + path + ": " + strerror(errno));
            return;
        }
        result.file = real;
        {
            std::shared_lock<std::shared_mutex> lock(g_index_mutex);
            if (g_index_files.count(result.file)) {
                result.already = true;
                return;
            }
        }
        gguf_init_params params = {/*no_alloc =*/ true, /*ctx =*/ nullptr};
        gguf_context * gctx = gguf_init_from_file(real, params);
        if (gctx == nullptr) {
            fail(HYDRA_ERR_LOAD_FAILED, result.file + " is not a readable GGUF file");
            return;
        }
        int fd = open(real, O_RDONLY | O_CLOEXEC);
        struct stat st = {};
        if (fd < 0 || fstat(fd, &st) != 0) {
            gguf_free(gctx);
            if (fd >= 0) close(fd);
            fail(HYDRA_ERR_LOAD_FAILED, "cannot open " + result.file);
            return;
        }
        void * map = mmap(nullptr, (size_t) st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (map == MAP_FAILED) {
            gguf_free(gctx);
            fail(HYDRA_ERR_LOAD_FAILED, "cannot map " + result.file);
            return;
        }
        const size_t data_offset = gguf_get_data_offset(gctx);
        std::vector<weights_region> regions;
        const int64_t n = gguf_get_n_tensors(gctx);
        result.tensors = (uint32_t) n;
        for (int64_t i = 0; i < n; i++) {
            size_t offs = data_offset + gguf_get_tensor_offset(gctx, i);
            size_t size = gguf_get_tensor_size(gctx, i);
            if (offs + size > (size_t) st.st_size) {
                munmap(map, (size_t) st.st_size);
                gguf_free(gctx);
                fail(HYDRA_ERR_LOAD_FAILED, result.file + " is truncated");
                return;
            }
            if (size > k_hash_threshold) {
                regions.push_back({(const uint8_t *) map + offs, size});
            }
        }
        gguf_free(gctx);
        // FNV-1a is byte-serial, so tensors are hashed in parallel instead (the biggest first).
        std::sort(regions.begin(), regions.end(), [](auto & a, auto & b) { return a.size > b.size; });
        std::vector<uint64_t> hashes(regions.size());
        std::atomic<size_t> next{0};
        auto hash_some = [&] {
            for (size_t i; (i = next++) < regions.size();) {
                hashes[i] = fnv1a64(regions[i].data, regions[i].size);
            }
        };
        std::vector<std::thread> threads;
        size_t n_threads = std::min<size_t>(regions.size(), std::max(1u, std::thread::hardware_concurrency()));
        for (size_t t = 1; t < n_threads; t++) {
            threads.emplace_back(hash_some);
        }
        hash_some();
        for (auto & t : threads) {
            t.join();
        }
        {
            std::unique_lock<std::shared_mutex> lock(g_index_mutex);
            for (size_t i = 0; i < regions.size(); i++) {
                if (g_index.emplace(hashes[i], regions[i]).second) {
                    result.indexed++;
                    result.bytes += regions[i].size;
                }
            }
            g_index_files.insert(result.file);
        }
        g_index_bytes += result.bytes;
        result.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    }

    void OnOK() override {
        Napi::Env env = Env();
        if (!code.empty()) {
            deferred.Reject(hydra_error_make(env, code.c_str(), message).Value());
            return;
        }
        Napi::Object out = Napi::Object::New(env);
        out.Set("file", result.file);
        out.Set("tensors", result.tensors);
        out.Set("indexed", result.indexed);
        out.Set("bytes", (double) result.bytes);
        out.Set("ms", result.ms);
        out.Set("already", result.already);
        deferred.Resolve(out);
    }

private:
    void fail(const char * c, std::string m) {
        code = c;
        message = std::move(m);
    }
    std::string path;
    Napi::Promise::Deferred deferred;
    index_result result;
    std::string code;
    std::string message;
};

// rpcWeightsIndexAdd(path) -> Promise<{file, tensors, indexed, bytes, ms, already}>
static Napi::Value weights_index_add(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsString()) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "path must be a string");
    }
    auto * worker = new index_worker(env, info[0].As<Napi::String>().Utf8Value());
    Napi::Promise promise = worker->promise();
    worker->Queue();
    return promise;
}

// rpcWeightsIndexInfo() -> {files, tensors, bytes, hits}
static Napi::Value weights_index_info(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    Napi::Object out = Napi::Object::New(env);
    std::shared_lock<std::shared_mutex> lock(g_index_mutex);
    Napi::Array files = Napi::Array::New(env);
    uint32_t i = 0;
    for (auto & f : g_index_files) {
        files.Set(i++, f);
    }
    out.Set("files", files);
    out.Set("tensors", (double) g_index.size());
    out.Set("bytes", (double) g_index_bytes.load());
    out.Set("hits", (double) g_resolve_hits.load());
    return out;
}

// ---------------------------------------------------------------------------------------------
// Peer loss. Upstream's client GGML_ABORTs (RPC_STATUS_ASSERT) in its per-endpoint dispatcher
// thread when a send or receive to the server fails, which would take the whole engine down with
// the peer. Two ways out were weighed: run the head's compute in a supervised child process, or
// keep it in-process and stop the abort. A child process would put a copy of every activation and
// the KV state behind another IPC hop for every decode step; instead, ggml's process-wide abort
// callback parks the failing thread for good (it never returns into ggml, so nothing downstream
// of the failure runs: no fail-soft, no corrupt output). The decode waiting on that dispatcher
// never completes; the engine's watchdog sees the stall (and its own HELLO probes fail), ends the
// in-flight requests with an error and rebuilds SOLO. The parked dispatcher thread, the decode
// thread waiting on it and the COMBINE model and context are leaked on purpose: freeing them would
// talk to the dead peer again. Aborts not raised by ggml-RPC keep upstream's behaviour.

static std::atomic<uint32_t> g_parked{0};
static std::mutex            g_park_mutex;
static std::string           g_park_last;
static ggml_abort_callback_t g_park_previous = nullptr;

static std::atomic<bool> g_park_enabled{false};

static void park_or_abort(const char * message) {
    // A thread serving a peer's ggml-RPC session: upstream asserts on hostile input (out-of-bounds
    // tensors, absurd shapes). Unwind that session alone; serve_rpc_fd catches, the peer's
    // connection closes, the engine lives on. ggml.c's frames carry x86-64 unwind tables.
    // A thread registering a peer: the connection or the HELLO failed (the peer went away after
    // JS probed it, or resolves differently in C). The registration fails instead of parking; no
    // dispatcher was cached yet, so a later attempt starts clean.
    if (t_rpc_serving || t_rpc_registering) {
        throw hydra_rpc_abort(message != nullptr ? message : "ggml abort");
    }
    // The message opens with __FILE__ of the aborting source: only ggml-RPC's are parked.
    if (g_park_enabled.load() && message != nullptr && strstr(message, "ggml-rpc") != nullptr) {
        {
            std::lock_guard<std::mutex> lock(g_park_mutex);
            g_park_last = message;
        }
        g_parked++;
        fprintf(stderr, "hydra: parked a ggml-RPC thread instead of aborting: %s\n", message);
        std::mutex m;
        std::unique_lock<std::mutex> lock(m);
        std::condition_variable never;
        for (;;) {
            never.wait(lock);
        }
    }
    if (g_park_previous) {
        g_park_previous(message);
    } else {
        fprintf(stderr, "%s\n", message);
    }
}

// rpcAbortParkInstall() -> true once installed (idempotent).
void hydra_abort_callback_install() {
    static std::once_flag once;
    std::call_once(once, [] { g_park_previous = ggml_set_abort_callback(park_or_abort); });
}

static Napi::Value abort_park_install(const Napi::CallbackInfo & info) {
    hydra_abort_callback_install();
    g_park_enabled = true;
    return Napi::Boolean::New(info.Env(), true);
}

// rpcParkedInfo() -> {parked, last}
static Napi::Value parked_info(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    Napi::Object out = Napi::Object::New(env);
    out.Set("parked", g_parked.load());
    std::lock_guard<std::mutex> lock(g_park_mutex);
    out.Set("last", g_park_last);
    return out;
}

void hydra_rpc_stats_init(Napi::Env env, Napi::Object exports);  // hydra_rpc_stats.cpp: per-peer accounting

void hydra_combine_init(Napi::Env env, Napi::Object exports) {
    exports.Set("rpcWeightsIndexAdd", Napi::Function::New(env, weights_index_add));
    exports.Set("rpcWeightsIndexInfo", Napi::Function::New(env, weights_index_info));
    exports.Set("rpcAbortParkInstall", Napi::Function::New(env, abort_park_install));
    exports.Set("rpcParkedInfo", Napi::Function::New(env, parked_info));
    hydra_rpc_stats_init(env, exports);
}
