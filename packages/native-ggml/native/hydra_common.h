// Shared declarations of the hydra_ggml addon: handle types and error helpers.
#pragma once

#include <napi.h>

#include <atomic>
#include <stdexcept>
#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>
#include <memory>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "llama.h"

// Error codes that cross into JS as `err.code`; documented in the package README.
#define HYDRA_ERR_LOAD_FAILED       "HYDRA_ERR_LOAD_FAILED"
#define HYDRA_ERR_LOAD_CANCELLED    "HYDRA_ERR_LOAD_CANCELLED"
#define HYDRA_ERR_BAD_ARGUMENT      "HYDRA_ERR_BAD_ARGUMENT"
#define HYDRA_ERR_DISPOSED          "HYDRA_ERR_DISPOSED"
#define HYDRA_ERR_CONTEXT_FAILED    "HYDRA_ERR_CONTEXT_FAILED"
#define HYDRA_ERR_DECODE_FAILED     "HYDRA_ERR_DECODE_FAILED"
#define HYDRA_ERR_PEER_UNREACHABLE  "HYDRA_ERR_PEER_UNREACHABLE"
#define HYDRA_ERR_STATE_FAILED      "HYDRA_ERR_STATE_FAILED"
#define HYDRA_ERR_BAD_OVERRIDE      "HYDRA_ERR_BAD_OVERRIDE"
#define HYDRA_ERR_NO_DEVICE         "HYDRA_ERR_NO_DEVICE"
#define HYDRA_ERR_SERVE_FAILED      "HYDRA_ERR_SERVE_FAILED"

Napi::Error hydra_error_make(Napi::Env env, const char * code, const std::string & message);
[[noreturn]] void hydra_error_throw(Napi::Env env, const char * code, const std::string & message);

// A loaded model. Freed by model_free or, failing that, by the External's finalizer.
struct hydra_model {
    llama_model * model = nullptr;
    std::mutex    mutex;   // held by every native call that uses the model off the JS thread
    int           n_contexts = 0;
};

// One OS thread per context that runs all of its compute. libuv hands AsyncWorker jobs to any of its
// pool threads, and each thread that calls ggml's CPU backend gets its own OpenMP team, which keeps
// spinning after its region: rotating pool threads would multiply the teams (figures in
// docs/decisions.md, 2026-11-29). One per context rather than one per process, so a step parked on
// a lost COMBINE peer holds only its own context.
class hydra_runner {
public:
    hydra_runner() : thread([this] { loop(); }) {}
    ~hydra_runner() {
        {
            std::lock_guard<std::mutex> lock(mutex);
            stopping = true;
        }
        wake.notify_all();
        thread.join();
    }
    // Queues fn behind what is already queued and returns at once. Tasks run one at a time in the
    // order they were posted, which is what lets a caller queue the next decode step before the
    // current one ends: the runner starts it the moment the GPU is done, with no round trip to JS.
    void post(std::function<void()> fn) {
        {
            std::lock_guard<std::mutex> lock(mutex);
            tasks.push_back(std::move(fn));
        }
        wake.notify_one();
    }
    // Runs fn on the runner thread, after what is already queued, and waits for it.
    void run(const std::function<void()> & fn) {
        std::mutex m;
        std::condition_variable cv;
        bool finished = false;
        post([&] {
            fn();
            std::lock_guard<std::mutex> lock(m);
            finished = true;
            cv.notify_all();
        });
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return finished; });
    }

private:
    void loop() {
        std::unique_lock<std::mutex> lock(mutex);
        while (true) {
            wake.wait(lock, [this] { return stopping || !tasks.empty(); });
            if (tasks.empty()) {
                return;  // stopping, and nothing left to run
            }
            std::function<void()> current = std::move(tasks.front());
            tasks.pop_front();
            lock.unlock();
            current();
            lock.lock();
        }
    }
    std::mutex mutex;
    std::condition_variable wake;
    std::deque<std::function<void()>> tasks;
    bool stopping = false;
    std::thread thread;
};

// A chain stage that leaves only the sampled token as an output of the on-device sampling graph
// (hydra_sampled_only.cpp): no logits, probability or candidate row is copied back per step.
llama_sampler * hydra_sampler_init_sampled_only();

struct hydra_sampler {
    llama_sampler * chain = nullptr;
    uint64_t id = 0;
    std::string signature;  // every parameter, seed included: equal signatures build equal chains
    bool stateless = false;  // argmax that keeps no state: a draft's positions may all sample on the device at once
};

// A sampler chain attached to a context for on-device sampling (a clone the context owns), ending
// in hydra_sampler_init_sampled_only's stage: every clone does, so equal signatures still mean
// equal clones.
struct hydra_attached {
    uint64_t id = 0;
    std::string signature;
    llama_sampler * clone = nullptr;
};

// A context and the scratch state one decode step needs. Decode steps may be queued back to back
// (`pending`, JS thread only); any other async operation runs alone (`busy`): a violation is a clear
// error instead of a data race.
struct hydra_context {
    llama_context *   ctx = nullptr;
    hydra_model *     owner = nullptr;
    // CPU placement pools (cpumask/strict_cpu), freed after the context; null when none was asked for.
    ggml_threadpool_t threadpool = nullptr;
    ggml_threadpool_t threadpool_batch = nullptr;
    void (*threadpool_free)(ggml_threadpool_t) = nullptr;
    llama_batch       batch = {};
    int32_t           n_batch = 0;
    int32_t           outputs_per_seq = 1;  // outputs one sequence may sample on the device in a step
    std::atomic<bool> busy{false};
    int32_t           pending = 0;          // decode steps queued or running
    Napi::ThreadSafeFunction done;          // hands finished steps back to the JS thread
    std::vector<llama_token> last_sampled;  // per sequence, runner thread only: what `follow` feeds
    std::unique_ptr<hydra_runner> runner = std::make_unique<hydra_runner>();
    // Backend (on-device) sampling: the context owns a clone of each sequence's chain, because
    // llama.cpp keeps using attached samplers in later graph reservations, long after the JS sampler
    // of a finished request may be gone. Keyed by the sampler's id, never its (reusable) address.
    bool backend_sampling = true;
    std::map<llama_seq_id, hydra_attached> attached;
    // Created for embeddings or ran an embed: every token of an input is an output there, more
    // than an attached chain allows per sequence, so no chain is attached to a sequence before it
    // samples (runner thread, as `attached`).
    bool embeddings = false;
};


template <typename T>
T * hydra_handle_get(const Napi::Value & value, const char * what) {
    Napi::Env env = value.Env();
    if (!value.IsExternal()) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, std::string(what) + " handle expected");
    }
    auto ** slot = value.As<Napi::External<T *>>().Data();
    if (slot == nullptr || *slot == nullptr) {
        hydra_error_throw(env, HYDRA_ERR_DISPOSED, std::string(what) + " was already disposed");
    }
    return *slot;
}

#include "ggml-backend.h"

struct hydra_device_info {
    std::string name, description, type, buffer_type;
    size_t free = 0, total = 0;
};

hydra_device_info device_info_read(ggml_backend_dev_t dev);
Napi::Object device_info_to_js(Napi::Env env, const hydra_device_info & info);
Napi::Object device_describe(Napi::Env env, ggml_backend_dev_t dev);

// Set while a thread serves a ggml-RPC session, or registers a peer: ggml aborts on that thread
// become hydra_rpc_abort exceptions that end the session (or fail the registration) instead of the
// process (hydra_combine.cpp).
extern thread_local bool t_rpc_serving;
extern thread_local bool t_rpc_registering;
struct hydra_rpc_abort : std::runtime_error {
    using std::runtime_error::runtime_error;
};
void hydra_abort_callback_install();

// Registration functions of each source file.
void hydra_rpc_serve_init(Napi::Env env, Napi::Object exports);
void hydra_combine_init(Napi::Env env, Napi::Object exports);
void hydra_embed_init(Napi::Env env, Napi::Object exports);
void hydra_draft_init(Napi::Env env, Napi::Object exports);  // hydra_draft.cpp: draft-model speculation
void hydra_ngram_init(Napi::Env env, Napi::Object exports);  // hydra_ngram.cpp: upstream's n-gram drafters
// ggml-RPC hash resolver over the weights index (hydra_combine.cpp), handed to every served session.
const void * hydra_weights_resolve(void * user_data, uint64_t hash, size_t * size);
