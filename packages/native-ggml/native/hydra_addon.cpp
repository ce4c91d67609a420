// hydra_ggml: a flat binding over llama.cpp. Blocking work (load, context creation, decode, state)
// runs in Napi::AsyncWorker with its arguments copied into plain structs first; quick lookups run
// on the JS thread. The TypeScript wrapper (src/binding.ts) types every function by hand.
#include "hydra_common.h"

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-rpc.h"
#include "llama-ext.h"  // llama_get_memory_breakdown: what llama.cpp allocated, per buffer type

#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#include <algorithm>

#include <cctype>
#include <cmath>
#include <cstdarg>
#include <cstring>
#include <memory>
#include <regex>
#include <string_view>
#include <thread>
#include <unordered_map>

// ---------------------------------------------------------------------------------------------
// errors and logging

Napi::Error hydra_error_make(Napi::Env env, const char * code, const std::string & message) {
    Napi::Error err = Napi::Error::New(env, message);
    err.Set("code", Napi::String::New(env, code));
    return err;
}

void hydra_error_throw(Napi::Env env, const char * code, const std::string & message) {
    throw hydra_error_make(env, code, message);
}

// Upstream reports load failures only through the log; the last error lines of the calling thread
// become the message of the JS error.
static thread_local std::string g_log_errors;
static std::atomic<int> g_log_level{GGML_LOG_LEVEL_ERROR};

static void hydra_log_callback(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        if (g_log_errors.size() > 4096) {
            g_log_errors.erase(0, g_log_errors.size() - 2048);
        }
        g_log_errors += text;
    }
    if (level == GGML_LOG_LEVEL_CONT || level >= g_log_level.load()) {
        fputs(text, stderr);
    }
}

static std::string trim_end(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) {
        s.pop_back();
    }
    return s;
}

static std::string log_errors_take() {
    std::string out;
    out.swap(g_log_errors);
    return trim_end(std::move(out));
}

// ---------------------------------------------------------------------------------------------
// handles: External<T*> whose slot is cleared on explicit disposal, so a late finalizer is a no-op

template <typename T>
static Napi::Value handle_make(Napi::Env env, T * object, void (*destroy)(T *)) {
    auto ** slot = new T *(object);
    return Napi::External<T *>::New(env, slot, [destroy](Napi::Env, T ** s) {
        if (*s != nullptr) {
            destroy(*s);
        }
        delete s;
    });
}

template <typename T>
static void handle_clear(const Napi::Value & value) {
    *value.As<Napi::External<T *>>().Data() = nullptr;
}

static void model_destroy(hydra_model * m) {
    if (m->model) {
        llama_model_free(m->model);
    }
    delete m;
}

static void context_destroy(hydra_context * c) {
    c->runner.reset();  // lets queued work finish first
    if (c->done) {
        c->done.Release();
    }
    if (c->ctx) {
        llama_batch_free(c->batch);
        llama_free(c->ctx);
        if (c->threadpool_free != nullptr) {  // after llama_free: the context computes on them until then
            if (c->threadpool != nullptr) c->threadpool_free(c->threadpool);
            if (c->threadpool_batch != nullptr) c->threadpool_free(c->threadpool_batch);
        }
        for (auto & [seq, owned] : c->attached) {
            if (owned.clone) {
                llama_sampler_free(owned.clone);
            }
        }
        c->owner->n_contexts--;
    }
    delete c;
}

// Synchronous KV operations run on the JS thread: never while the runner may be decoding.
static void context_check_idle(Napi::Env env, hydra_context * c) {
    if (c->pending > 0 || c->busy.load()) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "context is busy; await its pending operation first");
    }
}

static void sampler_destroy(hydra_sampler * s) {
    if (s->chain) {
        llama_sampler_free(s->chain);
    }
    delete s;
}

// ---------------------------------------------------------------------------------------------
// small argument readers

static std::string arg_string(const Napi::Object & o, const char * key, const std::string & dflt = "") {
    Napi::Value v = o.Get(key);
    return v.IsString() ? v.As<Napi::String>().Utf8Value() : dflt;
}

static double arg_number(const Napi::Object & o, const char * key, double dflt) {
    Napi::Value v = o.Get(key);
    return v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : dflt;
}

static bool arg_bool(const Napi::Object & o, const char * key, bool dflt) {
    Napi::Value v = o.Get(key);
    return v.IsBoolean() ? v.As<Napi::Boolean>().Value() : dflt;
}

static std::vector<std::string> arg_strings(const Napi::Object & o, const char * key) {
    std::vector<std::string> out;
    Napi::Value v = o.Get(key);
    if (v.IsArray()) {
        Napi::Array a = v.As<Napi::Array>();
        for (uint32_t i = 0; i < a.Length(); i++) {
            out.push_back(a.Get(i).ToString().Utf8Value());
        }
    }
    return out;
}

static const char * dev_type_name(enum ggml_backend_dev_type t) {
    switch (t) {
        case GGML_BACKEND_DEVICE_TYPE_CPU:   return "cpu";
        case GGML_BACKEND_DEVICE_TYPE_GPU:   return "gpu";
        case GGML_BACKEND_DEVICE_TYPE_IGPU:  return "igpu";
        case GGML_BACKEND_DEVICE_TYPE_ACCEL: return "accel";
        default:                             return "unknown";
    }
}

hydra_device_info device_info_read(ggml_backend_dev_t dev) {  // any thread: an RPC device answers over the wire
    hydra_device_info d;
    ggml_backend_dev_memory(dev, &d.free, &d.total);
    d.name = ggml_backend_dev_name(dev);
    d.description = ggml_backend_dev_description(dev);
    d.type = dev_type_name(ggml_backend_dev_type(dev));
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
    d.buffer_type = buft ? ggml_backend_buft_name(buft) : "";
    return d;
}

Napi::Object device_info_to_js(Napi::Env env, const hydra_device_info & info) {
    Napi::Object d = Napi::Object::New(env);
    d.Set("name", info.name);
    d.Set("description", info.description);
    d.Set("type", info.type);
    d.Set("free", Napi::Number::New(env, (double) info.free));
    d.Set("total", Napi::Number::New(env, (double) info.total));
    d.Set("bufferType", info.buffer_type);
    return d;
}

Napi::Object device_describe(Napi::Env env, ggml_backend_dev_t dev) {  // shared with hydra_rpc_serve.cpp
    return device_info_to_js(env, device_info_read(dev));
}

// ---------------------------------------------------------------------------------------------
// process setup and devices

// exit() runs static destructors (ggml's backends, thread pools) while a decode may still be running
// on a worker thread, which crashes the process instead of exiting with the code asked for; the
// caller has already written what it had to say.
static Napi::Value exit_now(const Napi::CallbackInfo & info) {
    fflush(stdout);
    fflush(stderr);
    _exit(info[0].ToNumber().Int32Value());
}

static Napi::Value backend_init(const Napi::CallbackInfo & info) {
    static std::once_flag once;
    std::call_once(once, [] {
        llama_log_set(hydra_log_callback, nullptr);
        llama_backend_init();
        ggml_backend_load_all();
        hydra_abort_callback_install();
    });
    if (info.Length() > 0 && info[0].IsNumber()) {
        g_log_level = info[0].As<Napi::Number>().Int32Value();
    }
    Napi::Object out = Napi::Object::New(info.Env());
    out.Set("systemInfo", llama_print_system_info());
    out.Set("rpcProtoMajor", 6);
    out.Set("supportsGpuOffload", llama_supports_gpu_offload());
    out.Set("supportsMmap", llama_supports_mmap());
    out.Set("maxDevices", Napi::Number::New(info.Env(), (double) llama_max_devices()));
    return out;
}

static Napi::Value devices_list(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    Napi::Array out = Napi::Array::New(env);
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        out.Set((uint32_t) i, device_describe(env, ggml_backend_dev_get(i)));
    }
    return out;
}

// devicesDescribe(names: string[]) -> Promise<device[]>: the named devices, memory included, read on
// a thread of their own. Asking an RPC device for its memory is a round trip that never returns once
// its peer is gone (the dispatcher parks), so it must not run on the JS thread, and not on a libuv
// pool thread either (a stalled one would be lost to loads and file I/O for good): a stall costs
// one idle detached thread. The pending promise does not keep the process alive. A connect that
// fails on this thread (no dispatcher yet) unwinds as the registration's does and rejects.
struct devices_describe_job {
    std::vector<ggml_backend_dev_t> devs;
    std::vector<hydra_device_info> out;
    std::string error;
    Napi::Promise::Deferred deferred;
    Napi::ThreadSafeFunction tsfn;
};

static Napi::Value devices_describe(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsArray()) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "names must be an array of device names");
    }
    auto * job = new devices_describe_job{{}, {}, {}, Napi::Promise::Deferred::New(env), {}};
    Napi::Array names = info[0].As<Napi::Array>();
    for (uint32_t i = 0; i < names.Length(); i++) {
        std::string name = names.Get(i).ToString().Utf8Value();
        ggml_backend_dev_t dev = ggml_backend_dev_by_name(name.c_str());
        if (dev == nullptr) {
            delete job;
            hydra_error_throw(env, HYDRA_ERR_NO_DEVICE, "unknown device '" + name + "'");
        }
        job->devs.push_back(dev);
    }
    Napi::Promise promise = job->deferred.Promise();
    job->tsfn = Napi::ThreadSafeFunction::New(env, Napi::Function::New(env, [](const Napi::CallbackInfo &) {}), "hydra_devices_describe", 0, 1);
    job->tsfn.Unref(env);
    std::thread([job] {
        t_rpc_registering = true;
        try {
            for (ggml_backend_dev_t dev : job->devs) {
                job->out.push_back(device_info_read(dev));
            }
        } catch (const hydra_rpc_abort & e) {
            job->error = trim_end(e.what());
        }
        t_rpc_registering = false;
        Napi::ThreadSafeFunction tsfn = job->tsfn;  // the callback frees job, maybe before Release
        tsfn.BlockingCall(job, [](Napi::Env env, Napi::Function, devices_describe_job * j) {
            if (!j->error.empty()) {
                j->deferred.Reject(hydra_error_make(env, HYDRA_ERR_PEER_UNREACHABLE, j->error).Value());
            } else {
                Napi::Array a = Napi::Array::New(env);
                for (size_t i = 0; i < j->out.size(); i++) {
                    a.Set((uint32_t) i, device_info_to_js(env, j->out[i]));
                }
                j->deferred.Resolve(a);
            }
            delete j;
        });
        tsfn.Release();
    }).detach();
    return promise;
}

// Registers the devices of a ggml-RPC server. The caller (the TS wrapper) has already completed a
// HELLO probe: upstream aborts the whole process when a server it connects to is unreachable.
class rpc_add_worker : public Napi::AsyncWorker {
public:
    rpc_add_worker(Napi::Env env, std::string endpoint)
        : Napi::AsyncWorker(env), deferred(Napi::Promise::Deferred::New(env)), endpoint(std::move(endpoint)) {}
    Napi::Promise promise() { return deferred.Promise(); }

    void Execute() override {
        t_rpc_registering = true;
        try {
            add();
        } catch (const hydra_rpc_abort & e) {
            SetError("ggml-RPC server " + endpoint + ": " + trim_end(e.what()));
        }
        t_rpc_registering = false;
    }
    void add() {
        static std::mutex mutex;
        static std::vector<std::string> registered;
        std::lock_guard<std::mutex> lock(mutex);
        ggml_backend_reg_t reg = ggml_backend_rpc_add_server(endpoint.c_str());
        if (reg == nullptr) {
            SetError("ggml-RPC server " + endpoint + " reports no devices");
            return;
        }
        if (std::find(registered.begin(), registered.end(), endpoint) == registered.end()) {
            ggml_backend_register(reg);
            registered.push_back(endpoint);
        }
        // Described here, off the JS thread: asking an RPC device for its memory is a round trip,
        // and the peer may be served by this very process, whose JS thread must accept it.
        for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); i++) {
            devices.push_back(device_info_read(ggml_backend_reg_dev_get(reg, i)));
        }
    }
    void OnOK() override {
        Napi::Array out = Napi::Array::New(Env());
        for (size_t i = 0; i < devices.size(); i++) {
            out.Set((uint32_t) i, device_info_to_js(Env(), devices[i]));
        }
        deferred.Resolve(out);
    }
    void OnError(const Napi::Error & e) override {
        deferred.Reject(hydra_error_make(Env(), HYDRA_ERR_PEER_UNREACHABLE, e.Message()).Value());
    }

private:
    Napi::Promise::Deferred deferred;
    std::string endpoint;
    std::vector<hydra_device_info> devices;
};

thread_local bool t_rpc_registering = false;

static Napi::Value rpc_server_add(const Napi::CallbackInfo & info) {
    auto * w = new rpc_add_worker(info.Env(), info[0].ToString().Utf8Value());
    Napi::Promise p = w->promise();
    w->Queue();
    return p;
}

// ---------------------------------------------------------------------------------------------
// model load

struct model_load_args {
    std::string path;
    int32_t n_gpu_layers = -1;
    llama_split_mode split_mode = LLAMA_SPLIT_MODE_LAYER;
    int32_t main_gpu = 0;
    std::vector<float> tensor_split;
    std::vector<ggml_backend_dev_t> devices;  // NULL-terminated when used
    std::vector<std::string> override_patterns;
    std::vector<llama_model_tensor_buft_override> overrides;  // NULL-terminated when used
    std::vector<llama_model_kv_override> kv_overrides;          // empty-key-terminated when used
    bool use_mmap = true;
    bool use_mlock = false;
    bool use_direct_io = false;
    bool check_tensors = false;
    bool no_extra_bufts = false;
    bool no_host = false;
};

struct load_progress_state {
    std::atomic<bool> cancelled{false};
    Napi::ThreadSafeFunction tsfn;
    bool has_tsfn = false;
    int last_percent = -1;
};

static bool model_load_progress(float progress, void * user_data) {
    auto * st = (load_progress_state *) user_data;
    int percent = (int) std::floor(progress * 100.0f);
    if (st->has_tsfn && percent != st->last_percent) {
        st->last_percent = percent;
        auto * value = new float(progress);
        st->tsfn.NonBlockingCall(value, [](Napi::Env env, Napi::Function cb, float * v) {
            cb.Call({Napi::Number::New(env, *v)});
            delete v;
        });
    }
    return !st->cancelled.load();
}

class model_load_worker : public Napi::AsyncWorker {
public:
    model_load_worker(Napi::Env env, std::unique_ptr<model_load_args> args, std::shared_ptr<load_progress_state> st)
        : Napi::AsyncWorker(env), deferred(Napi::Promise::Deferred::New(env)), args(std::move(args)), st(std::move(st)) {}
    Napi::Promise promise() { return deferred.Promise(); }

    void Execute() override {
        llama_model_params mp = llama_model_default_params();
        mp.n_gpu_layers = args->n_gpu_layers;
        mp.split_mode = args->split_mode;
        mp.main_gpu = args->main_gpu;
        if (!args->tensor_split.empty()) {
            args->tensor_split.resize(llama_max_devices(), 0.0f);
            mp.tensor_split = args->tensor_split.data();
        }
        if (!args->devices.empty()) {
            args->devices.push_back(nullptr);
            mp.devices = args->devices.data();
        }
        if (!args->overrides.empty()) {
            args->overrides.push_back({nullptr, nullptr});
            mp.tensor_buft_overrides = args->overrides.data();
        }
        if (!args->kv_overrides.empty()) {
            args->kv_overrides.emplace_back();
            args->kv_overrides.back().key[0] = 0;
            mp.kv_overrides = args->kv_overrides.data();
        }
        mp.load_mode = args->use_mmap ? (args->use_mlock ? LLAMA_LOAD_MODE_MMAP_MLOCK : LLAMA_LOAD_MODE_MMAP)
                                      : (args->use_mlock ? LLAMA_LOAD_MODE_MLOCK : LLAMA_LOAD_MODE_NONE);
        // As common_params_to_llama: direct I/O reads the file unbuffered and wins over mmap/mlock.
        if (args->use_direct_io) mp.load_mode = LLAMA_LOAD_MODE_DIRECT_IO;
        mp.check_tensors = args->check_tensors;
        mp.use_extra_bufts = !args->no_extra_bufts;
        mp.no_host = args->no_host;
        mp.progress_callback = model_load_progress;
        mp.progress_callback_user_data = st.get();
        log_errors_take();
        model = llama_model_load_from_file(args->path.c_str(), mp);
        if (model == nullptr) {
            std::string why = log_errors_take();
            SetError(why.empty() ? "failed to load model " + args->path : why);
        }
    }
    void OnOK() override {
        release();
        auto * m = new hydra_model();
        m->model = model;
        deferred.Resolve(handle_make<hydra_model>(Env(), m, model_destroy));
    }
    void OnError(const Napi::Error & e) override {
        release();
        const char * code = st->cancelled.load() ? HYDRA_ERR_LOAD_CANCELLED : HYDRA_ERR_LOAD_FAILED;
        deferred.Reject(hydra_error_make(Env(), code, e.Message()).Value());
    }

private:
    void release() {
        if (st->has_tsfn) {
            st->tsfn.Release();
            st->has_tsfn = false;
        }
    }
    Napi::Promise::Deferred deferred;
    std::unique_ptr<model_load_args> args;
    std::shared_ptr<load_progress_state> st;
    llama_model * model = nullptr;
};

static ggml_backend_buffer_type_t buft_by_name(const std::string & name, std::string & known) {
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
        if (buft == nullptr) {
            continue;
        }
        // Accept both the buffer type name ("CUDA0", "RPC0[host:port]") and the device name.
        if (name == ggml_backend_buft_name(buft) || name == ggml_backend_dev_name(dev)) {
            return buft;
        }
        known += known.empty() ? "" : ", ";
        known += ggml_backend_dev_name(dev);
    }
    return nullptr;
}

// modelLoad(params, onProgress?) -> {promise, cancel}
static Napi::Value model_load(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsObject()) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "modelLoad(params) needs a params object");
    }
    Napi::Object p = info[0].As<Napi::Object>();
    auto args = std::make_unique<model_load_args>();
    args->path = arg_string(p, "path");
    if (args->path.empty()) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "params.path must be a non-empty string");
    }
    args->n_gpu_layers = (int32_t) arg_number(p, "nGpuLayers", -1);
    std::string split = arg_string(p, "splitMode", "layer");
    if (split == "none") args->split_mode = LLAMA_SPLIT_MODE_NONE;
    else if (split == "layer") args->split_mode = LLAMA_SPLIT_MODE_LAYER;
    else if (split == "row") args->split_mode = LLAMA_SPLIT_MODE_ROW;
    else hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "params.splitMode must be none, layer or row");
    args->main_gpu = (int32_t) arg_number(p, "mainGpu", 0);
    Napi::Value ts = p.Get("tensorSplit");
    if (ts.IsArray()) {
        Napi::Array a = ts.As<Napi::Array>();
        if (a.Length() > llama_max_devices()) {
            hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "params.tensorSplit has more entries than devices allowed");
        }
        for (uint32_t i = 0; i < a.Length(); i++) {
            args->tensor_split.push_back((float) a.Get(i).ToNumber().DoubleValue());
        }
    }
    for (const std::string & name : arg_strings(p, "devices")) {
        ggml_backend_dev_t dev = ggml_backend_dev_by_name(name.c_str());
        if (dev == nullptr) {
            hydra_error_throw(env, HYDRA_ERR_NO_DEVICE, "no device named " + name);
        }
        args->devices.push_back(dev);
    }
    Napi::Value ov = p.Get("overrides");
    if (ov.IsArray()) {
        Napi::Array a = ov.As<Napi::Array>();
        args->override_patterns.reserve(a.Length());  // c_str() pointers must stay valid
        for (uint32_t i = 0; i < a.Length(); i++) {
            Napi::Object o = a.Get(i).As<Napi::Object>();
            std::string pattern = arg_string(o, "pattern");
            std::string buft_name = arg_string(o, "bufferType");
            try {
                std::regex check(pattern);
            } catch (const std::regex_error & e) {
                hydra_error_throw(env, HYDRA_ERR_BAD_OVERRIDE, "override pattern '" + pattern + "' is not a valid regex: " + e.what());
            }
            std::string known;
            ggml_backend_buffer_type_t buft = buft_by_name(buft_name, known);
            if (buft == nullptr) {
                hydra_error_throw(env, HYDRA_ERR_BAD_OVERRIDE, "unknown buffer type '" + buft_name + "' (devices: " + known + ")");
            }
            args->override_patterns.push_back(pattern);
            args->overrides.push_back({args->override_patterns.back().c_str(), buft});
        }
    }
    Napi::Value kvo = p.Get("kvOverrides");
    if (kvo.IsArray()) {
        Napi::Array a = kvo.As<Napi::Array>();
        for (uint32_t i = 0; i < a.Length(); i++) {
            Napi::Object o = a.Get(i).As<Napi::Object>();
            llama_model_kv_override kv = {};
            std::string key = arg_string(o, "key");
            std::string type = arg_string(o, "type");
            if (key.empty() || key.size() >= sizeof(kv.key)) {
                hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "kv override key must be 1..127 bytes");
            }
            strncpy(kv.key, key.c_str(), sizeof(kv.key) - 1);
            if (type == "int") { kv.tag = LLAMA_KV_OVERRIDE_TYPE_INT; kv.val_i64 = (int64_t) arg_number(o, "value", 0); }
            else if (type == "float") { kv.tag = LLAMA_KV_OVERRIDE_TYPE_FLOAT; kv.val_f64 = arg_number(o, "value", 0); }
            else if (type == "bool") { kv.tag = LLAMA_KV_OVERRIDE_TYPE_BOOL; kv.val_bool = arg_bool(o, "value", false); }
            else if (type == "str") {
                std::string s = arg_string(o, "value");
                if (s.size() >= sizeof(kv.val_str)) hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "kv override string too long");
                kv.tag = LLAMA_KV_OVERRIDE_TYPE_STR;
                strncpy(kv.val_str, s.c_str(), sizeof(kv.val_str) - 1);
            } else {
                hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "kv override type must be int, float, bool or str");
            }
            args->kv_overrides.push_back(kv);
        }
    }
    args->use_mmap = arg_bool(p, "useMmap", true);
    args->use_mlock = arg_bool(p, "useMlock", false);
    args->use_direct_io = arg_bool(p, "useDirectIo", false);
    args->check_tensors = arg_bool(p, "checkTensors", false);
    args->no_extra_bufts = arg_bool(p, "noExtraBufts", false);
    args->no_host = arg_bool(p, "noHost", false);

    auto st = std::make_shared<load_progress_state>();
    if (info.Length() > 1 && info[1].IsFunction()) {
        st->tsfn = Napi::ThreadSafeFunction::New(env, info[1].As<Napi::Function>(), "hydra_model_load_progress", 0, 1);
        st->has_tsfn = true;
    }
    auto * w = new model_load_worker(env, std::move(args), st);
    Napi::Object out = Napi::Object::New(env);
    out.Set("promise", w->promise());
    out.Set("cancel", Napi::Function::New(env, [st](const Napi::CallbackInfo &) { st->cancelled = true; }));
    w->Queue();
    return out;
}

static std::string model_meta(const llama_model * model, const std::string & key) {
    char buf[512];
    int32_t n = llama_model_meta_val_str(model, key.c_str(), buf, sizeof(buf));
    return n < 0 ? std::string() : std::string(buf);
}

static Napi::Value model_info(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    hydra_model * m = hydra_handle_get<hydra_model>(info[0], "model");
    const llama_model * model = m->model;
    const llama_vocab * vocab = llama_model_get_vocab(model);
    Napi::Object out = Napi::Object::New(env);
    std::string arch = model_meta(model, "general.architecture");
    char desc[256];
    llama_model_desc(model, desc, sizeof(desc));
    out.Set("arch", arch);
    out.Set("description", desc);
    out.Set("name", model_meta(model, "general.name"));
    out.Set("nLayer", llama_model_n_layer(model));
    out.Set("nEmbd", llama_model_n_embd(model));
    out.Set("nHead", llama_model_n_head(model));
    out.Set("nHeadKv", llama_model_n_head_kv(model));
    out.Set("nCtxTrain", llama_model_n_ctx_train(model));
    out.Set("nVocab", llama_vocab_n_tokens(vocab));
    out.Set("nParams", Napi::Number::New(env, (double) llama_model_n_params(model)));
    out.Set("size", Napi::Number::New(env, (double) llama_model_size(model)));
    std::string experts = model_meta(model, arch + ".expert_count");
    out.Set("nExpert", experts.empty() ? 0 : std::stoi(experts));
    const char * tmpl = llama_model_chat_template(model, nullptr);
    out.Set("chatTemplate", tmpl ? Napi::Value(Napi::String::New(env, tmpl)) : env.Null());
    out.Set("bos", llama_vocab_bos(vocab));
    out.Set("eos", llama_vocab_eos(vocab));
    out.Set("addBos", llama_vocab_get_add_bos(vocab));
    // A recurrent or hybrid memory cannot drop a sequence's last positions (rejected draft tokens).
    out.Set("recurrent", llama_model_is_recurrent(model) || llama_model_is_hybrid(model));
    // Fill-in-the-middle tokens (-1: the vocabulary has none), for llama-server's format_infill.
    out.Set("fimPre", llama_vocab_fim_pre(vocab));
    out.Set("fimSuf", llama_vocab_fim_suf(vocab));
    out.Set("fimMid", llama_vocab_fim_mid(vocab));
    out.Set("fimRep", llama_vocab_fim_rep(vocab));
    out.Set("fimSep", llama_vocab_fim_sep(vocab));
    return out;
}

static Napi::Value model_free(const Napi::CallbackInfo & info) {
    hydra_model * m = hydra_handle_get<hydra_model>(info[0], "model");
    if (m->n_contexts > 0) {
        hydra_error_throw(info.Env(), HYDRA_ERR_BAD_ARGUMENT, "model still has live contexts; free them first");
    }
    handle_clear<hydra_model>(info[0]);
    model_destroy(m);
    return info.Env().Undefined();
}

// Is the token an end-of-generation token (eos, eot, ...)?
static Napi::Value token_is_eog(const Napi::CallbackInfo & info) {
    hydra_model * m = hydra_handle_get<hydra_model>(info[0], "model");
    return Napi::Boolean::New(info.Env(), llama_vocab_is_eog(llama_model_get_vocab(m->model), info[1].ToNumber().Int32Value()));
}

// ---------------------------------------------------------------------------------------------
// tokens and chat templates (fast: on the JS thread)

static Napi::Value tokenize(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    hydra_model * m = hydra_handle_get<hydra_model>(info[0], "model");
    std::string text = info[1].ToString().Utf8Value();
    bool add_special = info.Length() > 2 && info[2].ToBoolean().Value();
    bool parse_special = info.Length() > 3 && info[3].ToBoolean().Value();
    const llama_vocab * vocab = llama_model_get_vocab(m->model);
    int32_t cap = (int32_t) text.size() + 8;
    std::vector<llama_token> tokens(cap);
    int32_t n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), tokens.data(), cap, add_special, parse_special);
    if (n < 0) {
        tokens.resize(-n);
        n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), tokens.data(), -n, add_special, parse_special);
    }
    if (n < 0) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "tokenization failed");
    }
    Napi::Int32Array out = Napi::Int32Array::New(env, n);
    memcpy(out.Data(), tokens.data(), sizeof(llama_token) * n);
    return out;
}

// Raw bytes of one token: a piece may be part of a UTF-8 sequence, JS decodes the stream.
static Napi::Value token_to_piece(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    hydra_model * m = hydra_handle_get<hydra_model>(info[0], "model");
    llama_token token = info[1].ToNumber().Int32Value();
    bool special = info.Length() > 2 && info[2].ToBoolean().Value();
    const llama_vocab * vocab = llama_model_get_vocab(m->model);
    if (token < 0 || token >= llama_vocab_n_tokens(vocab)) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "token id out of range");
    }
    char buf[256];
    int32_t n = llama_token_to_piece(vocab, token, buf, sizeof(buf), 0, special);
    if (n < 0) {
        std::vector<char> big(-n);
        n = llama_token_to_piece(vocab, token, big.data(), (int32_t) big.size(), 0, special);
        return Napi::Buffer<char>::Copy(env, big.data(), std::max(n, 0));
    }
    return Napi::Buffer<char>::Copy(env, buf, n);
}

static Napi::Value detokenize(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    hydra_model * m = hydra_handle_get<hydra_model>(info[0], "model");
    Napi::Int32Array tokens = info[1].As<Napi::Int32Array>();
    bool remove_special = info.Length() > 2 && info[2].ToBoolean().Value();
    bool unparse_special = info.Length() > 3 && info[3].ToBoolean().Value();
    const llama_vocab * vocab = llama_model_get_vocab(m->model);
    std::vector<char> text(tokens.ElementLength() * 8 + 16);
    int32_t n = llama_detokenize(vocab, tokens.Data(), (int32_t) tokens.ElementLength(), text.data(), (int32_t) text.size(), remove_special, unparse_special);
    if (n < 0) {
        text.resize(-n);
        n = llama_detokenize(vocab, tokens.Data(), (int32_t) tokens.ElementLength(), text.data(), (int32_t) text.size(), remove_special, unparse_special);
    }
    return Napi::String::New(env, text.data(), std::max(n, 0));
}

static Napi::Value chat_apply_template(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    hydra_model * m = hydra_handle_get<hydra_model>(info[0], "model");
    Napi::Array messages = info[1].As<Napi::Array>();
    bool add_assistant = info.Length() > 2 && info[2].ToBoolean().Value();
    std::string tmpl_override = info.Length() > 3 && info[3].IsString() ? info[3].As<Napi::String>().Utf8Value() : "";
    const char * tmpl = tmpl_override.empty() ? llama_model_chat_template(m->model, nullptr) : tmpl_override.c_str();
    std::vector<std::string> roles, contents;
    size_t total = 0;
    for (uint32_t i = 0; i < messages.Length(); i++) {
        Napi::Object msg = messages.Get(i).As<Napi::Object>();
        roles.push_back(arg_string(msg, "role"));
        contents.push_back(arg_string(msg, "content"));
        total += roles.back().size() + contents.back().size();
    }
    std::vector<llama_chat_message> chat;
    for (size_t i = 0; i < roles.size(); i++) {
        chat.push_back({roles[i].c_str(), contents[i].c_str()});
    }
    std::vector<char> buf(total * 2 + 256);
    int32_t n = llama_chat_apply_template(tmpl, chat.data(), chat.size(), add_assistant, buf.data(), (int32_t) buf.size());
    if (n > (int32_t) buf.size()) {
        buf.resize(n);
        n = llama_chat_apply_template(tmpl, chat.data(), chat.size(), add_assistant, buf.data(), (int32_t) buf.size());
    }
    if (n < 0) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "the model's chat template is not supported by llama_chat_apply_template");
    }
    return Napi::String::New(env, buf.data(), n);
}

// ---------------------------------------------------------------------------------------------
// tokens and chat templates off the JS thread (tokenizeAsync, chatApplyTemplateAsync)
//
// llama.cpp's tokenizer_st_partition keeps the fragments of the prompt in a forward_list and, for
// every special-token match, walks from the head of the list to the fragment it splits
// (std::distance, std::next): k matches cost O(k^2) list steps. A 976 KiB prompt of special tokens
// took 23 s; 150k chat messages render to 300k special tokens and took minutes. hydra_tokenize
// makes the same partition into a vector (O(specials x text) like upstream's own search, without the
// walk), then tokenizes each plain fragment by itself: a fragment never follows another fragment
// (one or more special tokens always separate them), so for the vocabulary types whose fragments are
// tokenized independently (SPM, BPE, UGM) the tokens are upstream's. Identical fragments are
// tokenized once. Other vocabulary types take upstream's path.

struct hydra_fragment {
    llama_token token;  // LLAMA_TOKEN_NULL for plain text
    size_t      offset;
    size_t      length;
};

static std::vector<llama_token> tokenize_upstream(const llama_vocab * vocab, const std::string & text, bool add_special, bool parse_special) {
    std::vector<llama_token> tokens(text.size() + 8);
    int32_t n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), tokens.data(), (int32_t) tokens.size(), add_special, parse_special);
    if (n < 0) {
        tokens.resize(-n);
        n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), tokens.data(), (int32_t) tokens.size(), add_special, parse_special);
    }
    if (n < 0) {
        throw std::runtime_error("tokenization failed");
    }
    tokens.resize(n);
    return tokens;
}

static std::vector<llama_token> hydra_tokenize(const llama_vocab * vocab, enum llama_vocab_type type, const std::string & text, bool add_special, bool parse_special) {
    if (text.size() > (size_t) INT32_MAX - 8) {
        throw std::runtime_error("the text is longer than llama_tokenize accepts");
    }
    if (type != LLAMA_VOCAB_TYPE_SPM && type != LLAMA_VOCAB_TYPE_BPE && type != LLAMA_VOCAB_TYPE_UGM) {
        return tokenize_upstream(vocab, text, add_special, parse_special);
    }
    // Upstream's special-token cache: the same members, the same sort, hence the same order.
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    std::vector<llama_token> specials;
    for (llama_token id = 0; id < n_vocab; id++) {
        if (llama_vocab_get_attr(vocab, id) & (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED | LLAMA_TOKEN_ATTR_UNKNOWN)) {
            specials.push_back(id);
        }
    }
    std::sort(specials.begin(), specials.end(), [&](llama_token a, llama_token b) {
        return strlen(llama_vocab_get_text(vocab, a)) > strlen(llama_vocab_get_text(vocab, b));
    });
    std::vector<hydra_fragment> frags;
    if (!text.empty()) {
        frags.push_back({LLAMA_TOKEN_NULL, 0, text.size()});
    }
    std::vector<hydra_fragment> next;
    for (llama_token id : specials) {
        const llama_token_attr attr = llama_vocab_get_attr(vocab, id);
        if (!parse_special && (attr & (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_UNKNOWN))) {
            continue;
        }
        const std::string_view st(llama_vocab_get_text(vocab, id));
        if (st.empty()) {
            continue;  // upstream would find it at every offset forever
        }
        // Most special tokens of a vocabulary never occur: one search of the whole text skips them
        // without a pass over the fragments (a fragment's matches are matches in the text).
        if (std::string_view(text).find(st) == std::string_view::npos) {
            continue;
        }
        size_t first = 0;
        while (first < frags.size() &&
               (frags[first].token != LLAMA_TOKEN_NULL ||
                std::string_view(text.data(), frags[first].offset + frags[first].length).find(st, frags[first].offset) == std::string_view::npos)) {
            first++;
        }
        if (first == frags.size()) {
            continue;
        }
        next.assign(frags.begin(), frags.begin() + first);
        for (size_t i = first; i < frags.size(); i++) {
            const hydra_fragment & f = frags[i];
            if (f.token != LLAMA_TOKEN_NULL) {
                next.push_back(f);
                continue;
            }
            size_t off = f.offset, len = f.length;
            while (true) {
                size_t match = std::string_view(text.data(), off + len).find(st, off);
                if (match == std::string_view::npos) {
                    if (len > 0) {
                        next.push_back({LLAMA_TOKEN_NULL, off, len});
                    }
                    break;
                }
                size_t left = match - off;
                if (attr & LLAMA_TOKEN_ATTR_LSTRIP) {
                    while (left > 0 && isspace((unsigned char) text[off + left - 1])) {
                        left--;
                    }
                }
                if (left > 0) {
                    next.push_back({LLAMA_TOKEN_NULL, off, left});
                }
                next.push_back({id, 0, 0});
                size_t right_off = match + st.size();
                size_t right_len = off + len - right_off;
                if (attr & LLAMA_TOKEN_ATTR_RSTRIP) {
                    while (right_len > 0 && isspace((unsigned char) text[right_off])) {
                        right_off++;
                        right_len--;
                    }
                }
                off = right_off;
                len = right_len;
            }
        }
        frags.swap(next);
    }
    std::vector<llama_token> out;
    if (add_special && llama_vocab_get_add_bos(vocab)) {
        out.push_back(llama_vocab_bos(vocab));
    }
    std::unordered_map<std::string_view, std::vector<llama_token>> seen;
    for (const hydra_fragment & f : frags) {
        if (f.token != LLAMA_TOKEN_NULL) {
            out.push_back(f.token);
            continue;
        }
        std::string_view piece(text.data() + f.offset, f.length);
        auto it = seen.find(piece);
        if (it == seen.end()) {
            it = seen.emplace(piece, tokenize_upstream(vocab, std::string(piece), false, false)).first;
        }
        out.insert(out.end(), it->second.begin(), it->second.end());
    }
    if (add_special && llama_vocab_get_add_eos(vocab)) {
        out.push_back(llama_vocab_eos(vocab));
    }
    return out;
}

// For hydra_chat.cpp, which tokenizes the prompts it renders in the same job.
std::vector<llama_token> hydra_tokenize_text(const llama_vocab * vocab, const std::string & text, bool add_special, bool parse_special) {
    return hydra_tokenize(vocab, llama_vocab_type(vocab), text, add_special, parse_special);
}

class tokenize_worker : public Napi::AsyncWorker {
public:
    tokenize_worker(Napi::Env env, hydra_model * m, Napi::Value model_handle, std::string text, bool add_special, bool parse_special, bool upstream)
        : Napi::AsyncWorker(env), deferred(Napi::Promise::Deferred::New(env)), m(m), text(std::move(text)), add_special(add_special), parse_special(parse_special), upstream(upstream) {
        model_ref = Napi::Persistent(model_handle);
    }
    Napi::Promise promise() { return deferred.Promise(); }

    void Execute() override {
        try {
            const llama_vocab * vocab = llama_model_get_vocab(m->model);
            tokens = upstream ? tokenize_upstream(vocab, text, add_special, parse_special)
                              : hydra_tokenize(vocab, llama_vocab_type(vocab), text, add_special, parse_special);
        } catch (const std::exception & e) {
            SetError(e.what());
        }
    }
    void OnOK() override {
        Napi::Int32Array out = Napi::Int32Array::New(Env(), tokens.size());
        memcpy(out.Data(), tokens.data(), sizeof(llama_token) * tokens.size());
        deferred.Resolve(out);
    }
    void OnError(const Napi::Error & e) override {
        deferred.Reject(hydra_error_make(Env(), HYDRA_ERR_BAD_ARGUMENT, e.Message()).Value());
    }

private:
    Napi::Promise::Deferred deferred;
    hydra_model * m;
    Napi::Reference<Napi::Value> model_ref;  // the model outlives the job (the wrapper defers explicit frees)
    std::string text;
    bool add_special, parse_special, upstream;
    std::vector<llama_token> tokens;
};

// (model, text, addSpecial, parseSpecial, upstream?) -> Promise<Int32Array>; upstream = true runs
// llama_tokenize as is (tests compare both paths, the benchmark times both).
static Napi::Value tokenize_async(const Napi::CallbackInfo & info) {
    hydra_model * m = hydra_handle_get<hydra_model>(info[0], "model");
    if (!info[1].IsString()) {
        hydra_error_throw(info.Env(), HYDRA_ERR_BAD_ARGUMENT, "text must be a string");
    }
    auto * w = new tokenize_worker(info.Env(), m, info[0], info[1].As<Napi::String>().Utf8Value(),
                                   info.Length() > 2 && info[2].ToBoolean().Value(), info.Length() > 3 && info[3].ToBoolean().Value(),
                                   info.Length() > 4 && info[4].ToBoolean().Value());
    Napi::Promise p = w->promise();
    w->Queue();
    return p;
}

class chat_template_worker : public Napi::AsyncWorker {
public:
    chat_template_worker(Napi::Env env, std::string tmpl, std::vector<std::string> roles, std::vector<std::string> contents, bool add_assistant, std::string packed = {})
        : Napi::AsyncWorker(env), deferred(Napi::Promise::Deferred::New(env)), tmpl(std::move(tmpl)), roles(std::move(roles)), contents(std::move(contents)), add_assistant(add_assistant), packed(std::move(packed)) {}
    Napi::Promise promise() { return deferred.Promise(); }

    // Tokenizes the rendered chat in the same job: the text never becomes a JS string (for 150k
    // messages, 10 MB made on the JS thread and copied back for tokenizeAsync).
    void tokenize_after(hydra_model * model, Napi::Value model_handle, bool add_special_, bool parse_special_) {
        vocab = llama_model_get_vocab(model->model);
        model_ref = Napi::Persistent(model_handle);
        add_special = add_special_;
        parse_special = parse_special_;
    }

    // The packed form (u32 LE count, then per message u32 LE length + role bytes, u32 LE length +
    // content bytes) lets a caller hand over a whole chat with one copy instead of one per string.
    bool unpack() {
        size_t at = 0;
        auto u32 = [&](uint32_t & v) {
            if (packed.size() - at < 4) {
                return false;
            }
            memcpy(&v, packed.data() + at, 4);  // little-endian hosts only, like ggml-RPC
            at += 4;
            return true;
        };
        auto str = [&](std::vector<std::string> & into) {
            uint32_t n;
            if (!u32(n) || packed.size() - at < n) {
                return false;
            }
            into.emplace_back(packed.data() + at, n);
            at += n;
            return true;
        };
        uint32_t count;
        if (!u32(count) || count > packed.size() / 8) {
            return false;
        }
        for (uint32_t i = 0; i < count; i++) {
            if (!str(roles) || !str(contents)) {
                return false;
            }
        }
        return at == packed.size();
    }

    void Execute() override {
        if (!packed.empty() && !unpack()) {
            SetError("the packed chat messages are malformed");
            return;
        }
        std::vector<llama_chat_message> chat;
        size_t total = 0;
        for (size_t i = 0; i < roles.size(); i++) {
            chat.push_back({roles[i].c_str(), contents[i].c_str()});
            total += roles[i].size() + contents[i].size();
        }
        std::vector<char> buf(total * 2 + 256);
        int32_t n = llama_chat_apply_template(tmpl.c_str(), chat.data(), chat.size(), add_assistant, buf.data(), (int32_t) buf.size());
        if (n > (int32_t) buf.size()) {
            buf.resize(n);
            n = llama_chat_apply_template(tmpl.c_str(), chat.data(), chat.size(), add_assistant, buf.data(), (int32_t) buf.size());
        }
        if (n < 0) {
            SetError("the model's chat template is not supported by llama_chat_apply_template");
            return;
        }
        out.assign(buf.data(), n);
        if (vocab != nullptr) {
            try {
                tokens = hydra_tokenize(vocab, llama_vocab_type(vocab), out, add_special, parse_special);
            } catch (const std::exception & e) {
                SetError(e.what());
            }
            out.clear();
        }
    }
    void OnOK() override {
        if (vocab == nullptr) {
            deferred.Resolve(Napi::String::New(Env(), out));
            return;
        }
        Napi::Int32Array arr = Napi::Int32Array::New(Env(), tokens.size());
        memcpy(arr.Data(), tokens.data(), sizeof(llama_token) * tokens.size());
        deferred.Resolve(arr);
    }
    void OnError(const Napi::Error & e) override {
        deferred.Reject(hydra_error_make(Env(), HYDRA_ERR_BAD_ARGUMENT, e.Message()).Value());
    }

private:
    Napi::Promise::Deferred deferred;
    std::string tmpl;
    std::vector<std::string> roles, contents;
    bool add_assistant;
    std::string packed;
    std::string out;
    const llama_vocab * vocab = nullptr;  // set: tokenize the rendered text too
    Napi::Reference<Napi::Value> model_ref;
    bool add_special = false, parse_special = false;
    std::vector<llama_token> tokens;
};

static std::string chat_template_of(const Napi::CallbackInfo & info, hydra_model * m, size_t arg) {
    if (info.Length() > arg && info[arg].IsString()) {
        return info[arg].As<Napi::String>().Utf8Value();
    }
    const char * t = llama_model_chat_template(m->model, nullptr);
    return t ? t : "chatml";  // llama_chat_apply_template's own default for a null template
}

// (model, roles[], contents[], addAssistant, template?) -> Promise<string>. Two string arrays, not
// message objects: copying them is the only work left on the JS thread.
static Napi::Value chat_apply_template_async(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    hydra_model * m = hydra_handle_get<hydra_model>(info[0], "model");
    if (!info[1].IsArray() || !info[2].IsArray()) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "roles and contents must be arrays");
    }
    Napi::Array roles_in = info[1].As<Napi::Array>();
    Napi::Array contents_in = info[2].As<Napi::Array>();
    if (roles_in.Length() != contents_in.Length()) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "roles and contents must have the same length");
    }
    std::vector<std::string> roles, contents;
    roles.reserve(roles_in.Length());
    contents.reserve(roles_in.Length());
    for (uint32_t i = 0; i < roles_in.Length(); i++) {
        Napi::Value r = roles_in.Get(i), c = contents_in.Get(i);
        if (!r.IsString() || !c.IsString()) {
            hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "roles and contents must hold strings");
        }
        roles.push_back(r.As<Napi::String>().Utf8Value());
        contents.push_back(c.As<Napi::String>().Utf8Value());
    }
    bool add_assistant = info.Length() > 3 && info[3].ToBoolean().Value();
    auto * w = new chat_template_worker(env, chat_template_of(info, m, 4), std::move(roles), std::move(contents), add_assistant);
    Napi::Promise p = w->promise();
    w->Queue();
    return p;
}

// (model, packed: Uint8Array, addAssistant, template?) -> Promise<string>, and with
// (..., addSpecial, parseSpecial) -> Promise<Int32Array> for chatTokenizePackedAsync. The bytes
// are copied here and unpacked in the worker.
static Napi::Value chat_packed_job(const Napi::CallbackInfo & info, bool tokenize) {
    Napi::Env env = info.Env();
    hydra_model * m = hydra_handle_get<hydra_model>(info[0], "model");
    if (!info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "packed messages must be a Uint8Array");
    }
    Napi::Uint8Array bytes = info[1].As<Napi::Uint8Array>();
    std::string packed((const char *) bytes.Data(), bytes.ByteLength());
    if (packed.empty()) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "the packed chat messages are malformed");
    }
    bool add_assistant = info.Length() > 2 && info[2].ToBoolean().Value();
    auto * w = new chat_template_worker(env, chat_template_of(info, m, 3), {}, {}, add_assistant, std::move(packed));
    if (tokenize) {
        w->tokenize_after(m, info[0], info.Length() > 4 && info[4].ToBoolean().Value(), info.Length() > 5 && info[5].ToBoolean().Value());
    }
    Napi::Promise p = w->promise();
    w->Queue();
    return p;
}

static Napi::Value chat_apply_template_packed_async(const Napi::CallbackInfo & info) {
    return chat_packed_job(info, false);
}

static Napi::Value chat_tokenize_packed_async(const Napi::CallbackInfo & info) {
    return chat_packed_job(info, true);
}

// ---------------------------------------------------------------------------------------------
// context

struct context_args {
    llama_context_params cp;
};

static enum ggml_type kv_type_from_name(Napi::Env env, const std::string & name) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char * n = ggml_type_name((enum ggml_type) t);
        if (n != nullptr && name == n) {
            return (enum ggml_type) t;
        }
    }
    hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "unknown KV cache type '" + name + "'");
}

// CPU placement of one thread group (cpuparams / cpuparams_batch), as common_cpu_params holds it.
struct cpu_placement {
    bool mask_valid = false;
    bool mask[GGML_MAX_N_THREADS] = {};
    bool strict = false;
};

// A hex mask, lowest bit CPU 0, as common's parse_cpu_mask reads --cpu-mask.
static cpu_placement cpu_placement_from(Napi::Env env, const Napi::Object & p, const char * mask_key, const char * strict_key) {
    cpu_placement out;
    std::string hex = arg_string(p, mask_key);
    if (hex.rfind("0x", 0) == 0 || hex.rfind("0X", 0) == 0) hex = hex.substr(2);
    for (size_t i = 0; i < hex.size(); i++) {
        const char ch = hex[hex.size() - 1 - i];
        const int v = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (v < 0) hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, std::string("params.") + mask_key + " must be a hex CPU mask");
        for (int b = 0; b < 4; b++) {
            if (((v >> b) & 1) == 0) continue;
            if (i * 4 + b >= GGML_MAX_N_THREADS) {
                hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, std::string("params.") + mask_key + " names a CPU past GGML_MAX_N_THREADS");
            }
            out.mask[i * 4 + b] = true;
            out.mask_valid = true;
        }
    }
    out.strict = arg_bool(p, strict_key, false);
    return out;
}

// With OpenMP, ggml applies a threadpool's mask to libgomp's process-wide workers at every compute
// and never undoes it, so once any context was placed, every later context gets a pool with the
// process's own mask: threads pinned by a gone context must not stay pinned for the next one.
static std::atomic<bool> cpu_placement_used{false};

static ggml_threadpool_params threadpool_params_of(const cpu_placement & cpu, int32_t n_threads) {
    ggml_threadpool_params t;
    ggml_threadpool_params_init(&t, n_threads);
    if (cpu.mask_valid) {
        std::memcpy(t.cpumask, cpu.mask, sizeof(t.cpumask));
    } else {
        cpu_set_t own;
        CPU_ZERO(&own);
        if (sched_getaffinity(getpid(), sizeof(own), &own) == 0) {  // the main thread's, never pinned here
            for (int i = 0; i < GGML_MAX_N_THREADS && i < CPU_SETSIZE; i++) t.cpumask[i] = CPU_ISSET(i, &own);
        }
    }
    t.strict_cpu = cpu.strict;
    return t;
}

class context_create_worker : public Napi::AsyncWorker {
public:
    context_create_worker(Napi::Env env, hydra_model * m, Napi::Value model_handle, llama_context_params cp, bool backend_sampling,
                          cpu_placement cpu, cpu_placement cpu_batch)
        : Napi::AsyncWorker(env), deferred(Napi::Promise::Deferred::New(env)), m(m), cp(cp), backend_sampling(backend_sampling),
          cpu(cpu), cpu_batch(cpu_batch) {
        model_ref = Napi::Persistent(model_handle);
    }
    Napi::Promise promise() { return deferred.Promise(); }

    void Execute() override {
        log_errors_take();
        ctx = llama_init_from_model(m->model, cp);
        if (ctx == nullptr) {
            std::string why = log_errors_take();
            SetError(why.empty() ? "failed to create the context" : why);
        }
        // Created with embeddings so its graphs are reserved for them; an embedBatch turns them on
        // for its own batch only (hydra_embed.cpp), as llama-server does per batch.
        if (ctx != nullptr && cp.embeddings) llama_set_embeddings(ctx, false);
        if (ctx != nullptr && (cpu.mask_valid || cpu.strict || cpu_batch.mask_valid || cpu_batch.strict || cpu_placement_used.load())) {
            attach_threadpools();
        }
    }
    // As common_threadpools::init: a batch pool only when its settings differ, the other one paused.
    void attach_threadpools() {
        cpu_placement_used = true;
        auto * reg = ggml_backend_dev_backend_reg(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU));
        auto * new_fn = (decltype(ggml_threadpool_new) *) ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_new");
        free_fn = (decltype(ggml_threadpool_free) *) ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_free");
        if (new_fn == nullptr || free_fn == nullptr) {
            SetError("the CPU backend exports no ggml_threadpool_new");
            return;
        }
        ggml_threadpool_params tpp = threadpool_params_of(cpu, cp.n_threads);
        ggml_threadpool_params tpp_batch = threadpool_params_of(cpu_batch, cp.n_threads_batch);
        // A pthread (non-OpenMP) pool pins the thread that creates it: this one is libuv's.
        cpu_set_t saved;
        const bool have_saved = pthread_getaffinity_np(pthread_self(), sizeof(saved), &saved) == 0;
        if (!ggml_threadpool_params_match(&tpp, &tpp_batch)) {
            tp_batch = new_fn(&tpp_batch);
            tpp.paused = true;
        }
        tp = new_fn(&tpp);
        if (have_saved) pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
        if (tp == nullptr || (tpp.paused && tp_batch == nullptr)) {
            SetError("ggml_threadpool_new failed for the requested CPU placement");
            return;
        }
        llama_attach_threadpool(ctx, tp, tp_batch);
    }
    void OnOK() override {
        auto * c = new hydra_context();
        c->ctx = ctx;
        c->threadpool = tp;
        c->threadpool_batch = tp_batch;
        c->threadpool_free = free_fn;
        c->owner = m;
        c->n_batch = (int32_t) llama_n_batch(ctx);
        c->outputs_per_seq = cp.n_outputs_max_per_seq == 0 ? c->n_batch : std::min((int32_t) cp.n_outputs_max_per_seq, c->n_batch);
        c->backend_sampling = backend_sampling;
        c->embeddings = cp.embeddings;
        c->batch = llama_batch_init(c->n_batch, 0, 1);
        c->last_sampled.assign(llama_n_seq_max(ctx), -1);
        c->done = Napi::ThreadSafeFunction::New(Env(), Napi::Function::New(Env(), [](const Napi::CallbackInfo &) {}), "hydra_decode_done", 0, 1);
        c->done.Unref(Env());  // referenced only while steps are pending
        m->n_contexts++;
        deferred.Resolve(handle_make<hydra_context>(Env(), c, context_destroy));
    }
    void OnError(const Napi::Error & e) override {
        if (ctx != nullptr) llama_free(ctx);
        if (free_fn != nullptr) {
            if (tp != nullptr) free_fn(tp);
            if (tp_batch != nullptr) free_fn(tp_batch);
        }
        deferred.Reject(hydra_error_make(Env(), HYDRA_ERR_CONTEXT_FAILED, e.Message()).Value());
    }

private:
    Napi::Promise::Deferred deferred;
    hydra_model * m;
    Napi::Reference<Napi::Value> model_ref;  // keeps the model alive while the context is built
    llama_context_params cp;
    bool backend_sampling;
    cpu_placement cpu, cpu_batch;
    llama_context * ctx = nullptr;
    ggml_threadpool_t tp = nullptr;
    ggml_threadpool_t tp_batch = nullptr;
    void (*free_fn)(ggml_threadpool_t) = nullptr;
};

static Napi::Value context_create(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    hydra_model * m = hydra_handle_get<hydra_model>(info[0], "model");
    Napi::Object p = info.Length() > 1 && info[1].IsObject() ? info[1].As<Napi::Object>() : Napi::Object::New(env);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) arg_number(p, "nCtx", cp.n_ctx);
    cp.n_batch = (uint32_t) arg_number(p, "nBatch", cp.n_batch);
    cp.n_ubatch = (uint32_t) arg_number(p, "nUbatch", cp.n_ubatch);
    cp.n_seq_max = (uint32_t) arg_number(p, "nSeqMax", 1);
    // llama.cpp's default is 1; a speculative draft of N guesses samples N + 1 outputs of one sequence.
    cp.n_outputs_max_per_seq = (uint32_t) arg_number(p, "nOutputsMaxPerSeq", cp.n_outputs_max_per_seq);
    // Recurrent-state snapshots per sequence, so a rejected speculative guess of up to this many
    // tokens can be rolled back (llama.cpp clamps it to 0 for an arch without partial rollback).
    cp.n_rs_seq = (uint32_t) arg_number(p, "nRsSeq", cp.n_rs_seq);
    int32_t hw = (int32_t) std::max(1u, std::thread::hardware_concurrency());
    cp.n_threads = (int32_t) arg_number(p, "nThreads", hw);
    cp.n_threads_batch = (int32_t) arg_number(p, "nThreadsBatch", cp.n_threads);
    std::string fa = arg_string(p, "flashAttn", "auto");
    cp.flash_attn_type = fa == "on" ? LLAMA_FLASH_ATTN_TYPE_ENABLED : fa == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED : LLAMA_FLASH_ATTN_TYPE_AUTO;
    cp.type_k = kv_type_from_name(env, arg_string(p, "typeK", "f16"));
    cp.type_v = kv_type_from_name(env, arg_string(p, "typeV", "f16"));
    cp.rope_freq_base = (float) arg_number(p, "ropeFreqBase", cp.rope_freq_base);
    cp.rope_freq_scale = (float) arg_number(p, "ropeFreqScale", cp.rope_freq_scale);
    std::string rs = arg_string(p, "ropeScalingType", "");
    if (rs == "none") cp.rope_scaling_type = LLAMA_ROPE_SCALING_TYPE_NONE;
    else if (rs == "linear") cp.rope_scaling_type = LLAMA_ROPE_SCALING_TYPE_LINEAR;
    else if (rs == "yarn") cp.rope_scaling_type = LLAMA_ROPE_SCALING_TYPE_YARN;
    cp.yarn_ext_factor = (float) arg_number(p, "yarnExtFactor", cp.yarn_ext_factor);
    cp.yarn_attn_factor = (float) arg_number(p, "yarnAttnFactor", cp.yarn_attn_factor);
    cp.yarn_beta_fast = (float) arg_number(p, "yarnBetaFast", cp.yarn_beta_fast);
    cp.yarn_beta_slow = (float) arg_number(p, "yarnBetaSlow", cp.yarn_beta_slow);
    cp.yarn_orig_ctx = (uint32_t) arg_number(p, "yarnOrigCtx", cp.yarn_orig_ctx);
    cp.offload_kqv = arg_bool(p, "offloadKqv", cp.offload_kqv);
    cp.op_offload = arg_bool(p, "opOffload", cp.op_offload);
    cp.swa_full = arg_bool(p, "swaFull", cp.swa_full);
    cp.kv_unified = arg_bool(p, "kvUnified", cp.kv_unified);
    cp.no_perf = arg_bool(p, "noPerf", true);
    cp.embeddings = arg_bool(p, "embeddings", false);
    std::string pooling = arg_string(p, "poolingType", "unspecified");
    if (pooling == "none") cp.pooling_type = LLAMA_POOLING_TYPE_NONE;
    else if (pooling == "mean") cp.pooling_type = LLAMA_POOLING_TYPE_MEAN;
    else if (pooling == "cls") cp.pooling_type = LLAMA_POOLING_TYPE_CLS;
    else if (pooling == "last") cp.pooling_type = LLAMA_POOLING_TYPE_LAST;
    else if (pooling == "rank") cp.pooling_type = LLAMA_POOLING_TYPE_RANK;
    else if (pooling != "unspecified") hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "poolingType must be unspecified, none, mean, cls, last or rank");
    std::string attention = arg_string(p, "attentionType", "unspecified");
    if (attention == "causal") cp.attention_type = LLAMA_ATTENTION_TYPE_CAUSAL;
    else if (attention == "non_causal") cp.attention_type = LLAMA_ATTENTION_TYPE_NON_CAUSAL;
    else if (attention != "unspecified") hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "attentionType must be unspecified, causal or non_causal");
    cpu_placement cpu = cpu_placement_from(env, p, "cpuMask", "cpuStrict");
    cpu_placement cpu_batch = cpu_placement_from(env, p, "cpuMaskBatch", "cpuStrictBatch");
    if (cp.n_batch == 0 || cp.n_ubatch == 0 || cp.n_seq_max == 0 || cp.n_seq_max > llama_max_parallel_sequences()) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "nBatch, nUbatch must be positive and nSeqMax within 1..llama_max_parallel_sequences()");
    }
    auto * w = new context_create_worker(env, m, info[0], cp, arg_bool(p, "backendSampling", true), cpu, cpu_batch);
    Napi::Promise promise = w->promise();
    w->Queue();
    return promise;
}

static Napi::Value context_free(const Napi::CallbackInfo & info) {
    hydra_context * c = hydra_handle_get<hydra_context>(info[0], "context");
    context_check_idle(info.Env(), c);
    handle_clear<hydra_context>(info[0]);
    context_destroy(c);
    return info.Env().Undefined();
}

static Napi::Value context_info(const Napi::CallbackInfo & info) {
    hydra_context * c = hydra_handle_get<hydra_context>(info[0], "context");
    Napi::Object out = Napi::Object::New(info.Env());
    out.Set("nCtx", llama_n_ctx(c->ctx));
    out.Set("nCtxSeq", llama_n_ctx_seq(c->ctx));
    out.Set("nBatch", llama_n_batch(c->ctx));
    out.Set("nUbatch", llama_n_ubatch(c->ctx));
    out.Set("nSeqMax", llama_n_seq_max(c->ctx));
    out.Set("nRsSeq", llama_n_rs_seq(c->ctx));
    out.Set("nThreads", llama_n_threads(c->ctx));
    out.Set("nThreadsBatch", llama_n_threads_batch(c->ctx));
    return out;
}

// contextMemory(ctx) -> [{bufferType, device, host, model, context, compute}] in bytes, as llama.cpp
// allocated them; device is the buffer type's device (null when it has none), host whether the
// buffer lives in host memory (a pinned CUDA_Host buffer names a CUDA device but takes host RAM)
static Napi::Value context_memory(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    hydra_context * c = hydra_handle_get<hydra_context>(info[0], "context");
    Napi::Array out = Napi::Array::New(env);
    uint32_t i = 0;
    for (const auto & [buft, mb] : llama_get_memory_breakdown(c->ctx)) {
        Napi::Object o = Napi::Object::New(env);
        o.Set("bufferType", ggml_backend_buft_name(buft));
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
        o.Set("device", dev ? Napi::Value(Napi::String::New(env, ggml_backend_dev_name(dev))) : env.Null());
        o.Set("host", Napi::Boolean::New(env, ggml_backend_buft_is_host(buft)));
        o.Set("model", Napi::Number::New(env, (double) mb.model));
        o.Set("context", Napi::Number::New(env, (double) mb.context));
        o.Set("compute", Napi::Number::New(env, (double) mb.compute));
        out.Set(i++, o);
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// samplers: a chain per sequence, built as common_sampler_init (common/sampling.cpp) builds it from
// common_params_sampling, from the pinned llama.cpp's own samplers; stages that cannot change the
// result (a disabled penalty, DRY or XTC, typical at 1) are left out so the default chain stays
// offloadable to the backend

static const char * const SAMPLER_STAGES[] = {"penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p",
                                              "min_p", "xtc", "temperature", "infill", "adaptive_p"};

static Napi::Value sampler_create(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    hydra_model * m = hydra_handle_get<hydra_model>(info[0], "model");
    Napi::Object p = info.Length() > 1 && info[1].IsObject() ? info[1].As<Napi::Object>() : Napi::Object::New(env);
    const llama_vocab * vocab = llama_model_get_vocab(m->model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    float temp = (float) arg_number(p, "temp", 0.8);
    int32_t top_k = (int32_t) arg_number(p, "topK", 40);
    float top_p = (float) arg_number(p, "topP", 0.95);
    float min_p = (float) arg_number(p, "minP", 0.05);
    float typ_p = (float) arg_number(p, "typP", 1.0);
    size_t min_keep = (size_t) std::max(0.0, arg_number(p, "minKeep", 1));
    float penalty_repeat = (float) arg_number(p, "penaltyRepeat", 1.0);
    float penalty_freq = (float) arg_number(p, "penaltyFreq", 0.0);
    float penalty_present = (float) arg_number(p, "penaltyPresent", 0.0);
    int32_t penalty_last_n = (int32_t) arg_number(p, "penaltyLastN", 64);
    uint32_t seed = (uint32_t) arg_number(p, "seed", LLAMA_DEFAULT_SEED);
    std::string grammar = arg_string(p, "grammar");
    // A tool-call grammar of the common chat layer: lazy from a trigger on, or prefilled with the
    // generation prompt the template already wrote (common_sampler_init does both).
    const bool grammar_lazy = p.Has("grammarLazy") && p.Get("grammarLazy").ToBoolean().Value();
    std::vector<std::string> trigger_patterns = p.Has("grammarTriggerPatterns") ? arg_strings(p, "grammarTriggerPatterns") : std::vector<std::string>{};
    std::vector<llama_token> trigger_tokens;
    if (p.Has("grammarTriggerTokens")) {
        Napi::Value v = p.Get("grammarTriggerTokens");
        if (!v.IsArray()) {
            hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "params.grammarTriggerTokens must be an array of token ids");
        }
        Napi::Array a = v.As<Napi::Array>();
        for (uint32_t i = 0; i < a.Length(); i++) {
            int32_t t = a.Get(i).ToNumber().Int32Value();
            if (t < 0 || t >= n_vocab) {
                hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "params.grammarTriggerTokens: token id out of range");
            }
            trigger_tokens.push_back(t);
        }
    }
    std::string grammar_prefill = arg_string(p, "grammarPrefill");
    float xtc_probability = (float) arg_number(p, "xtcProbability", 0.0);
    float xtc_threshold = (float) arg_number(p, "xtcThreshold", 0.1);
    float dynatemp_range = (float) arg_number(p, "dynatempRange", 0.0);
    float dynatemp_exponent = (float) arg_number(p, "dynatempExponent", 1.0);
    float dry_multiplier = (float) arg_number(p, "dryMultiplier", 0.0);
    float dry_base = (float) arg_number(p, "dryBase", 1.75);
    int32_t dry_allowed_length = (int32_t) arg_number(p, "dryAllowedLength", 2);
    int32_t dry_penalty_last_n = (int32_t) arg_number(p, "dryPenaltyLastN", -1);
    std::vector<std::string> dry_breakers = p.Has("drySequenceBreakers") ? arg_strings(p, "drySequenceBreakers")
                                                                           : std::vector<std::string>{"\n", ":", "\"", "*"};
    float adaptive_target = (float) arg_number(p, "adaptiveTarget", -1.0);
    float adaptive_decay = (float) arg_number(p, "adaptiveDecay", 0.9);
    int32_t mirostat = (int32_t) arg_number(p, "mirostat", 0);
    float mirostat_tau = (float) arg_number(p, "mirostatTau", 5.0);
    float mirostat_eta = (float) arg_number(p, "mirostatEta", 0.1);
    float top_n_sigma = (float) arg_number(p, "topNSigma", -1.0);
    // -1 is "the whole context" for both windows, as llama-server maps it before building the chain.
    const int32_t n_ctx_train = llama_model_n_ctx_train(m->model);
    if (penalty_last_n == -1) penalty_last_n = n_ctx_train;
    if (dry_penalty_last_n == -1) dry_penalty_last_n = n_ctx_train;
    std::vector<std::string> stages = p.Has("samplers") ? arg_strings(p, "samplers")
                                                        : std::vector<std::string>(SAMPLER_STAGES, SAMPLER_STAGES + 9);
    for (const std::string & s : stages) {
        if (std::find(std::begin(SAMPLER_STAGES), std::end(SAMPLER_STAGES), s) == std::end(SAMPLER_STAGES)) {
            hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "params.samplers: unknown sampler \"" + s + "\"");
        }
    }
    if (mirostat < 0 || mirostat > 2) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "params.mirostat must be 0, 1 or 2");
    }
    std::vector<llama_logit_bias> biases;
    Napi::Value lb = p.Get("logitBias");
    if (lb.IsArray()) {
        Napi::Array a = lb.As<Napi::Array>();
        for (uint32_t i = 0; i < a.Length(); i++) {
            Napi::Value e = a.Get(i);
            Napi::Object o = e.IsObject() ? e.As<Napi::Object>() : Napi::Object::New(env);
            double token = arg_number(o, "token", -1);
            double bias = arg_number(o, "bias", NAN);
            if (!(token >= 0 && token < n_vocab && token == std::floor(token)) || std::isnan(bias)) {
                hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "params.logitBias[" + std::to_string(i) +
                                  "] must be {token, bias} with a token id below " + std::to_string(n_vocab));
            }
            biases.push_back({(llama_token) token, (float) bias});
        }
    }

    llama_sampler_chain_params scp = llama_sampler_chain_default_params();
    scp.no_perf = true;
    llama_sampler * chain = llama_sampler_chain_init(scp);
    if (!grammar.empty()) {
        llama_sampler * g = nullptr;
        if (grammar_lazy) {
            std::vector<const char *> pats;
            for (const std::string & t : trigger_patterns) {
                pats.push_back(t.c_str());
            }
            g = llama_sampler_init_grammar_lazy_patterns(vocab, grammar.c_str(), "root", pats.data(), pats.size(),
                                                         trigger_tokens.data(), trigger_tokens.size());
        } else {
            g = llama_sampler_init_grammar(vocab, grammar.c_str(), "root");
        }
        if (g == nullptr) {
            llama_sampler_free(chain);
            hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "grammar failed to parse");
        }
        if (!grammar_lazy && !grammar_prefill.empty()) {
            std::vector<llama_token> pre(grammar_prefill.size() + 2);
            int32_t n = llama_tokenize(vocab, grammar_prefill.data(), (int32_t) grammar_prefill.size(), pre.data(), (int32_t) pre.size(), false, true);
            pre.resize(std::max(0, n));
            try {
                for (size_t i = 0; i < pre.size(); i++) {
                    char piece[8] = {0};
                    // As common_sampler_init: a space some tokenizers put before a first special token is skipped.
                    if (i == 0 && llama_token_to_piece(vocab, pre[i], piece, sizeof(piece), 0, true) > 0 && isspace((unsigned char) piece[0]) &&
                        !isspace((unsigned char) grammar_prefill[0])) {
                        continue;
                    }
                    llama_sampler_accept(g, pre[i]);
                }
            } catch (const std::exception & e) {
                llama_sampler_free(g);
                llama_sampler_free(chain);
                hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, std::string("grammar does not accept its prefill: ") + e.what());
            }
        }
        llama_sampler_chain_add(chain, g);
    }
    if (!biases.empty()) {
        llama_sampler_chain_add(chain, llama_sampler_init_logit_bias(n_vocab, (int32_t) biases.size(), biases.data()));
    }
    if (mirostat != 0) {
        llama_sampler_chain_add(chain, llama_sampler_init_temp(temp));
        llama_sampler_chain_add(chain, mirostat == 1 ? llama_sampler_init_mirostat(n_vocab, seed, mirostat_tau, mirostat_eta, 100)
                                                     : llama_sampler_init_mirostat_v2(seed, mirostat_tau, mirostat_eta));
    } else {
        // temp <= 0 is argmax (upstream's temperature keeps the top logit alone): the stages that
        // always keep the top token are skipped and greedy ends the chain.
        const bool greedy = temp <= 0.0f;
        bool adaptive = false;
        for (const std::string & s : stages) {
            if (s == "penalties") {
                if ((penalty_repeat != 1.0f || penalty_freq != 0.0f || penalty_present != 0.0f) && penalty_last_n != 0) {
                    llama_sampler_chain_add(chain, llama_sampler_init_penalties(n_vocab, penalty_last_n, penalty_repeat, penalty_freq, penalty_present));
                }
            } else if (s == "dry") {
                if (dry_multiplier != 0.0f && dry_base >= 1.0f && dry_penalty_last_n != 0) {
                    std::vector<const char *> breakers;
                    for (const std::string & b : dry_breakers) {
                        breakers.push_back(b.c_str());
                    }
                    llama_sampler_chain_add(chain, llama_sampler_init_dry(vocab, dry_multiplier, dry_base, dry_allowed_length,
                                                                          dry_penalty_last_n, breakers.data(), breakers.size()));
                }
            } else if (s == "top_n_sigma") {
                if (!greedy && top_n_sigma > 0.0f) {
                    llama_sampler_chain_add(chain, llama_sampler_init_top_n_sigma(top_n_sigma));
                }
            } else if (s == "top_k") {
                if (!greedy) {
                    llama_sampler_chain_add(chain, llama_sampler_init_top_k(top_k));
                }
            } else if (s == "typ_p") {
                if (typ_p < 1.0f) {
                    llama_sampler_chain_add(chain, llama_sampler_init_typical(typ_p, min_keep));  // no backend version
                }
            } else if (s == "top_p") {
                if (!greedy) {
                    llama_sampler_chain_add(chain, llama_sampler_init_top_p(top_p, min_keep));
                }
            } else if (s == "min_p") {
                if (!greedy) {
                    llama_sampler_chain_add(chain, llama_sampler_init_min_p(min_p, min_keep));
                }
            } else if (s == "xtc") {
                if (xtc_probability > 0.0f) {
                    llama_sampler_chain_add(chain, llama_sampler_init_xtc(xtc_probability, xtc_threshold, min_keep, seed));
                }
            } else if (s == "temperature") {
                if (!greedy) {
                    llama_sampler_chain_add(chain, dynatemp_range > 0.0f ? llama_sampler_init_temp_ext(temp, dynatemp_range, dynatemp_exponent)
                                                                         : llama_sampler_init_temp(temp));
                }
            } else if (s == "infill") {
                llama_sampler_chain_add(chain, llama_sampler_init_infill(vocab));
            } else if (s == "adaptive_p") {
                adaptive = true;  // it picks the token, so it ends the chain (as in common_sampler_init)
            }
        }
        if (greedy) {
            llama_sampler_chain_add(chain, llama_sampler_init_greedy());
        } else if (adaptive) {
            llama_sampler_chain_add(chain, llama_sampler_init_adaptive_p(adaptive_target, adaptive_decay, seed));
        } else {
            llama_sampler_chain_add(chain, llama_sampler_init_dist(seed));
        }
    }
    static std::atomic<uint64_t> next_id{1};
    auto * s = new hydra_sampler();
    s->chain = chain;
    s->id = next_id++;
    s->stateless = temp <= 0.0f && mirostat == 0 && grammar.empty() && xtc_probability <= 0.0f && dry_multiplier == 0.0f &&
                   penalty_repeat == 1.0f && penalty_freq == 0.0f && penalty_present == 0.0f;
    char sig[1024];
    snprintf(sig, sizeof(sig), "%a/%d/%a/%a/%a/%zu/%a/%a/%a/%d/%u/%a/%a/%a/%a/%a/%a/%d/%d/%a/%a/%d/%a/%a/%a/", temp, top_k, top_p,
             min_p, typ_p, min_keep, penalty_repeat, penalty_freq, penalty_present, penalty_last_n, seed, xtc_probability,
             xtc_threshold, dynatemp_range, dynatemp_exponent, dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n,
             adaptive_target, adaptive_decay, mirostat, mirostat_tau, mirostat_eta, top_n_sigma);
    std::string signature(sig);
    for (const std::string & st : stages) {
        signature += st + ",";
    }
    for (const std::string & b : dry_breakers) {
        signature += std::to_string(b.size()) + ":" + b;
    }
    for (const llama_logit_bias & b : biases) {
        char one[64];
        snprintf(one, sizeof(one), "%d=%a,", b.token, b.bias);
        signature += one;
    }
    s->signature = signature + "/" + grammar;
    if (!grammar.empty()) {
        s->signature += "/" + std::to_string(grammar_lazy) + "/" + std::to_string(grammar_prefill.size()) + ":" + grammar_prefill;
        for (const std::string & t : trigger_patterns) {
            s->signature += "/" + std::to_string(t.size()) + ":" + t;
        }
        for (llama_token t : trigger_tokens) {
            s->signature += "/t" + std::to_string(t);
        }
    }
    return handle_make<hydra_sampler>(env, s, sampler_destroy);
}

std::string hydra_json_schema_to_grammar(const std::string & schema);  // hydra_json_schema.cpp
Napi::Value hydra_chat_common_apply_async(const Napi::CallbackInfo & info);  // hydra_chat.cpp
Napi::Value hydra_chat_common_parse_async(const Napi::CallbackInfo & info);

// jsonSchemaToGrammar(schemaText) -> GBNF (common's json_schema_to_grammar); a schema text over 1 MiB
// is refused before conversion, which runs on the calling thread like a grammar parse does.
static Napi::Value json_schema_to_grammar_js(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsString()) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "jsonSchemaToGrammar needs the schema as JSON text");
    }
    std::string schema = info[0].As<Napi::String>().Utf8Value();
    if (schema.size() > (1u << 20)) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "JSON schema over 1 MiB");
    }
    std::string grammar;
    try {
        grammar = hydra_json_schema_to_grammar(schema);
    } catch (const std::exception & e) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, std::string("bad JSON schema: ") + e.what());
    }
    return Napi::String::New(env, grammar);
}

// samplerNames(sampler) -> the chain's stages as llama.cpp names them (llama_sampler_name)
static Napi::Value sampler_names(const Napi::CallbackInfo & info) {
    hydra_sampler * s = hydra_handle_get<hydra_sampler>(info[0], "sampler");
    Napi::Array out = Napi::Array::New(info.Env());
    for (int i = 0; i < llama_sampler_chain_n(s->chain); i++) {
        out.Set((uint32_t) i, llama_sampler_name(llama_sampler_chain_get(s->chain, i)));
    }
    return out;
}

static Napi::Value sampler_free(const Napi::CallbackInfo & info) {
    hydra_sampler * s = hydra_handle_get<hydra_sampler>(info[0], "sampler");
    handle_clear<hydra_sampler>(info[0]);
    sampler_destroy(s);
    return info.Env().Undefined();
}

// Feeds tokens (e.g. the prompt) to the sampler's history without sampling (repeat penalties).
static Napi::Value sampler_accept(const Napi::CallbackInfo & info) {
    hydra_sampler * s = hydra_handle_get<hydra_sampler>(info[0], "sampler");
    Napi::Int32Array tokens = info[1].As<Napi::Int32Array>();
    // A grammar constrains what is generated, not the prompt (common_sampler_accept with
    // accept_grammar false): history goes to the stages after it.
    const int n = llama_sampler_chain_n(s->chain);
    const bool grammar = n > 0 && strcmp(llama_sampler_name(llama_sampler_chain_get(s->chain, 0)), "grammar") == 0;
    for (size_t i = 0; i < tokens.ElementLength(); i++) {
        if (!grammar) {
            llama_sampler_accept(s->chain, tokens[i]);
            continue;
        }
        for (int k = 1; k < n; k++) {
            llama_sampler_accept(llama_sampler_chain_get(s->chain, k), tokens[i]);
        }
    }
    return info.Env().Undefined();
}

// ---------------------------------------------------------------------------------------------
// decode: one native call per step for every active sequence

struct decode_entry {
    llama_seq_id seq;
    llama_pos pos;
    std::vector<llama_token> tokens;  // empty when `follow`
    bool follow = false;              // feed the token this sequence sampled at its previous step
    const hydra_sampler * sampler = nullptr;  // null: no sampling; kept alive by the step's refs
    bool want_logits;
    // The last n_draft tokens are guesses (speculative decoding): the sampler runs after each of the
    // last n_draft + 1 positions in turn and stops at the first sample that differs from the next
    // guess, so it accepts exactly the tokens a one-token-a-step loop would have sampled.
    int32_t n_draft = 0;
    llama_token sampled = -1;
    std::vector<llama_token> run;  // n_draft > 0: every token sampled, in order
    std::vector<float> logits;
    // n_probs > 0: the sampled token's probability and the n_probs most likely candidates, as
    // llama-server's populate_token_probs computes them (softmax over the whole vocabulary, or the
    // chain's candidates after sampling when post_sampling).
    int32_t n_probs = 0;
    bool post_sampling = false;
    float prob = 0.0f;
    std::vector<llama_token> top_ids;
    std::vector<float> top_probs;
    // The sequence's partial state (recurrent part only) read right after this step, for a prompt
    // checkpoint: no other call can touch the context between the decode and the read.
    bool checkpoint = false;
    std::vector<uint8_t> state;
};

// get_token_probabilities (tools/server/server-common.cpp): every token's softmax probability,
// the n_top most likely first.
static std::vector<llama_token_data> hydra_token_probs(const float * logits, int32_t n_vocab, size_t n_top) {
    std::vector<llama_token_data> cur(n_vocab);
    for (llama_token t = 0; t < n_vocab; t++) {
        cur[t] = llama_token_data{t, logits[t], 0.0f};
    }
    n_top = std::min(n_top, cur.size());
    std::partial_sort(cur.begin(), cur.begin() + n_top, cur.end(),
                      [](const llama_token_data & a, const llama_token_data & b) { return a.logit > b.logit; });
    float max_l = cur[0].logit;
    float cum_sum = 0.0f;
    for (llama_token_data & t : cur) {
        t.p = expf(t.logit - max_l);
        cum_sum += t.p;
    }
    for (llama_token_data & t : cur) {
        t.p /= cum_sum;
    }
    return cur;
}

// One decode step, queued on the context's runner from the JS thread at call time (so steps run in
// call order, back to back) and handed back to the JS thread through the context's `done` function.
class decode_job {
public:
    decode_job(Napi::Env env, hydra_context * c, std::vector<decode_entry> entries, std::vector<Napi::Reference<Napi::Value>> refs)
        : deferred(Napi::Promise::Deferred::New(env)), c(c), entries(std::move(entries)), refs(std::move(refs)) {}
    Napi::Promise promise() { return deferred.Promise(); }

    // Runner thread.
    void execute() {
        step();
        // A sequence whose step failed has nothing to follow: a queued `follow` step fails clearly
        // instead of feeding a stale token.
        for (const decode_entry & e : entries) {
            c->last_sampled[e.seq] = failed.empty() ? e.sampled : -1;
        }
    }

    void SetError(const std::string & message) { failed = message; }

    // JS thread, through the context's `done` function (env is null when Node is shutting down).
    static void settle(Napi::Env env, Napi::Function, decode_job * job) {
        hydra_context * c = job->c;
        if (env != nullptr) {
            if (--c->pending == 0) {
                c->done.Unref(env);
            }
            if (job->failed.empty()) {
                job->OnOK(env);
            } else {
                Napi::Error err = hydra_error_make(env, HYDRA_ERR_DECODE_FAILED, job->failed);
                err.Set("status", Napi::Number::New(env, job->status));
                job->deferred.Reject(err.Value());
            }
        }
        delete job;
    }

    // Attaches each entry's chain (as a context-owned clone) for on-device sampling, so a step
    // returns token ids instead of copying and scanning a full vocabulary of logits on the CPU.
    // Entries that want logits sample on the CPU instead.
    void attach_samplers() {
        for (decode_entry & e : entries) {
            if (e.sampler == nullptr && !e.want_logits) {
                continue;  // nothing is read back: whatever is attached may stay
            }
            // Looked up only here: a sequence without an entry in `attached` never sampled.
            hydra_attached & a = c->attached[e.seq];
            // The device samples a draft's positions independently, right for a chain without state
            // only; a stateful one samples them on the host in turn.
            // Probabilities need the logits or the chain's candidates on the host (llama-server
            // turns on-device sampling off for pre-sampling probabilities too).
            bool want_backend = c->backend_sampling && e.sampler != nullptr && !e.want_logits && e.n_probs == 0 &&
                                (e.n_draft == 0 || (e.sampler->stateless && e.n_draft + 1 <= c->outputs_per_seq));
            if (!want_backend) {
                if (a.clone != nullptr) {
                    llama_set_sampler(c->ctx, e.seq, nullptr);
                    llama_sampler_free(a.clone);
                }
                a = hydra_attached{};
                continue;
            }
            if (a.id == e.sampler->id) {
                continue;
            }
            if (a.clone != nullptr && a.signature == e.sampler->signature) {
                // Same chain for a new request: reset its state instead of re-attaching, which
                // would make llama.cpp reserve its graphs again.
                llama_sampler_reset(a.clone);
                a.id = e.sampler->id;
                continue;
            }
            llama_sampler * clone = llama_sampler_clone(e.sampler->chain);
            // want_backend: this entry reads back the sampled id alone, so the rows the device
            // stages leave (greedy the whole logits row, dist its softmax too) stay on the device.
            llama_sampler_chain_add(clone, hydra_sampler_init_sampled_only());
            if (!llama_set_sampler(c->ctx, e.seq, clone)) {
                llama_sampler_free(clone);  // refused by llama.cpp: the host samples with the original chain
                clone = nullptr;
            }
            if (a.clone != nullptr) {
                llama_sampler_free(a.clone);
            }
            a = hydra_attached{e.sampler->id, e.sampler->signature, clone};
            if (clone != nullptr) {
                attach_to_unused(*e.sampler);
            }
        }
    }

    // Every llama_set_sampler makes the next decode reserve the context's graphs again, and
    // llama.cpp does that with a new scheduler: every compute buffer and the pinned host input
    // buffer (the KQ mask's, n_ubatch x n_ctx cells with -kvu) freed and allocated anew, inside the
    // step that carries every running stream. A request on a slot that never sampled paid that (on
    // the H200, 8B, -kvu, 160K cells: one step per long prompt 43/61/135 ms above its neighbours at
    // n_ubatch 256/384/512). So the first attach of a chain also attaches clones of it to every
    // sequence that never sampled, in the reserve that attach pays anyway; a later request with the
    // same chain there only resets its clone. A sequence that sampled keeps what it has.
    void attach_to_unused(const hydra_sampler & s) {
        if (c->embeddings) {
            return;
        }
        const llama_seq_id n_seq = (llama_seq_id) llama_n_seq_max(c->ctx);
        for (llama_seq_id seq = 0; seq < n_seq; seq++) {
            if (c->attached.count(seq) > 0) {
                continue;
            }
            llama_sampler * clone = llama_sampler_clone(s.chain);
            llama_sampler_chain_add(clone, hydra_sampler_init_sampled_only());
            if (!llama_set_sampler(c->ctx, seq, clone)) {
                llama_sampler_free(clone);
                return;
            }
            c->attached[seq] = hydra_attached{0, s.signature, clone};  // id 0: no request's sampler
        }
    }

    void step() {
        for (decode_entry & e : entries) {
            if (!e.follow) {
                continue;
            }
            llama_token t = c->last_sampled[e.seq];
            if (t < 0) {
                SetError("seq " + std::to_string(e.seq) + " has no sampled token to follow: its previous step failed or sampled nothing");
                return;
            }
            e.tokens.assign(1, t);
        }
        attach_samplers();
        llama_batch & batch = c->batch;
        const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(c->owner->model));
        size_t entry = 0, offset = 0;
        // Fill the batch with as many tokens as fit, across entries; after each llama_decode, sample
        // the entries whose last token was in that chunk before the next chunk overwrites logits.
        while (entry < entries.size()) {
            batch.n_tokens = 0;
            std::vector<std::pair<size_t, int32_t>> finished;  // (entry, batch index of its last token)
            while (entry < entries.size() && batch.n_tokens < c->n_batch) {
                decode_entry & e = entries[entry];
                // A draft's outputs must all be in one chunk (the next one overwrites the logits).
                if (e.n_draft > 0 && offset == 0 && batch.n_tokens > 0 && (int32_t) e.tokens.size() > c->n_batch - batch.n_tokens) {
                    break;
                }
                size_t take = std::min(e.tokens.size() - offset, (size_t) (c->n_batch - batch.n_tokens));
                for (size_t k = 0; k < take; k++) {
                    int32_t i = batch.n_tokens++;
                    bool last = offset + k + 1 == e.tokens.size();
                    bool guessed = e.n_draft > 0 && offset + k + e.n_draft + 1 >= e.tokens.size();
                    batch.token[i] = e.tokens[offset + k];
                    batch.pos[i] = e.pos + (llama_pos) (offset + k);
                    batch.n_seq_id[i] = 1;
                    batch.seq_id[i][0] = e.seq;
                    batch.logits[i] = guessed || (last && (e.sampler != nullptr || e.want_logits));
                    if (last) {
                        finished.emplace_back(entry, i);
                    }
                }
                offset += take;
                if (offset == e.tokens.size()) {
                    entry++;
                    offset = 0;
                }
            }
            log_errors_take();
            int32_t rc = llama_decode(c->ctx, batch);
            if (rc != 0) {
                std::string why = log_errors_take();
                SetError(rc == 1 ? "no KV cache room for this batch (context full)" : "llama_decode failed with code " + std::to_string(rc) + (why.empty() ? "" : ": " + why));
                status = rc;
                return;
            }
            for (auto [index, i] : finished) {
                decode_entry & e = entries[index];
                if (e.want_logits) {
                    const float * row = llama_get_logits_ith(c->ctx, i);
                    e.logits.assign(row, row + n_vocab);
                }
                if (e.n_draft > 0) {
                    // Batch index of the first sampled position; the others follow it.
                    int32_t first = i - e.n_draft;
                    llama_sampler * on_device = c->attached[e.seq].clone;
                    e.run.clear();
                    for (int32_t d = 0; d <= e.n_draft; d++) {
                        llama_token token = on_device ? llama_get_sampled_token_ith(c->ctx, first + d) : LLAMA_TOKEN_NULL;
                        if (token != LLAMA_TOKEN_NULL) {
                            llama_sampler_accept(on_device, token);
                        } else {
                            token = llama_sampler_sample(on_device ? on_device : e.sampler->chain, c->ctx, first + d);
                        }
                        e.run.push_back(token);
                        if (d == e.n_draft || token != e.tokens[e.tokens.size() - e.n_draft + d]) {
                            break;
                        }
                    }
                    e.sampled = e.run.back();
                } else if (e.sampler != nullptr && e.n_probs > 0) {
                    if (!sample_with_probs(e, i, n_vocab)) {
                        return;
                    }
                } else if (e.sampler != nullptr) {
                    llama_sampler * on_device = c->attached[e.seq].clone;
                    llama_token token = on_device ? llama_get_sampled_token_ith(c->ctx, i) : LLAMA_TOKEN_NULL;
                    if (token != LLAMA_TOKEN_NULL) {
                        llama_sampler_accept(on_device, token);
                        e.sampled = token;
                    } else {
                        // llama.cpp attaches any chain and runs its offloadable prefix (logit bias,
                        // penalties, top-k, ...) on the device; the attached clone knows which
                        // stages ran, so it samples the rest. The original chain would apply that
                        // prefix a second time (a bias or a penalty counted twice).
                        e.sampled = llama_sampler_sample(on_device ? on_device : e.sampler->chain, c->ctx, i);
                    }
                }
            }
        }
        // llama_decode returns before the device finishes when nothing is read back; a step is
        // only done when its work is.
        llama_synchronize(c->ctx);
        for (decode_entry & e : entries) {
            if (!e.checkpoint) {
                continue;
            }
            e.state.resize(llama_state_seq_get_size_ext(c->ctx, e.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY));
            size_t n = llama_state_seq_get_data_ext(c->ctx, e.state.data(), e.state.size(), e.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            e.state.resize(n);  // 0: no checkpoint (reported as null)
        }
    }

    // Samples entry `e` on the host (no chain is attached to its sequence) and fills its
    // probabilities as llama-server's populate_token_probs does.
    bool sample_with_probs(decode_entry & e, int32_t i, int32_t n_vocab) {
        const float * logits = llama_get_logits_ith(c->ctx, i);
        llama_sampler * chain = e.sampler->chain;
        const size_t n_top = std::min((size_t) e.n_probs, (size_t) n_vocab);
        if (!e.post_sampling) {
            std::vector<llama_token_data> cur = hydra_token_probs(logits, n_vocab, n_top);
            e.sampled = llama_sampler_sample(chain, c->ctx, i);
            for (const llama_token_data & t : cur) {
                if (t.id == e.sampled) {
                    e.prob = t.p;
                    break;
                }
            }
            for (size_t k = 0; k < n_top; k++) {
                e.top_ids.push_back(cur[k].id);
                e.top_probs.push_back(cur[k].p);
            }
            return true;
        }
        // llama_sampler_sample's host path, keeping the candidates it leaves.
        std::vector<llama_token_data> cur(n_vocab);
        for (llama_token t = 0; t < n_vocab; t++) {
            cur[t] = llama_token_data{t, logits[t], 0.0f};
        }
        llama_token_data_array cur_p = {cur.data(), cur.size(), -1, false};
        llama_sampler_apply(chain, &cur_p);
        if (cur_p.selected < 0 || cur_p.selected >= (int64_t) cur_p.size) {
            SetError("seq " + std::to_string(e.seq) + ": the sampler chain selected no token");
            return false;
        }
        e.sampled = cur_p.data[cur_p.selected].id;
        llama_sampler_accept(chain, e.sampled);
        // Our greedy stage stands for upstream's temperature 0 followed by dist, which leaves the top
        // token with probability 1 and every other 0; greedy itself computes none.
        const int n_stages = llama_sampler_chain_n(chain);
        if (n_stages > 0 && strcmp(llama_sampler_name(llama_sampler_chain_get(chain, n_stages - 1)), "greedy") == 0) {
            for (size_t k = 0; k < cur_p.size; k++) {
                cur_p.data[k].p = (int64_t) k == cur_p.selected ? 1.0f : 0.0f;
            }
        }
        // common_sampler_get_candidates(do_sort = true)
        if (!cur_p.sorted) {
            std::sort(cur_p.data, cur_p.data + cur_p.size,
                      [](const llama_token_data & a, const llama_token_data & b) { return a.p > b.p; });
        }
        for (size_t k = 0; k < cur_p.size; k++) {
            if (cur_p.data[k].id == e.sampled) {
                e.prob = cur_p.data[k].p;
                break;
            }
        }
        for (size_t k = 0; k < std::min(n_top, cur_p.size); k++) {
            // As upstream: some stages leave zeros, others drop the token; both end the list.
            if (cur_p.data[k].p == 0.0f) {
                break;
            }
            e.top_ids.push_back(cur_p.data[k].id);
            e.top_probs.push_back(cur_p.data[k].p);
        }
        return true;
    }
private:
    void OnOK(Napi::Env env) {
        Napi::Int32Array tokens = Napi::Int32Array::New(env, entries.size());
        Napi::Array logits = Napi::Array::New(env);
        for (size_t i = 0; i < entries.size(); i++) {
            tokens[i] = entries[i].sampled;
            if (entries[i].want_logits) {
                Napi::Float32Array row = Napi::Float32Array::New(env, entries[i].logits.size());
                memcpy(row.Data(), entries[i].logits.data(), entries[i].logits.size() * sizeof(float));
                logits.Set((uint32_t) i, row);
            } else {
                logits.Set((uint32_t) i, env.Null());
            }
        }
        Napi::Object out = Napi::Object::New(env);
        out.Set("tokens", tokens);
        out.Set("logits", logits);
        bool drafted = false;
        for (const decode_entry & e : entries) {
            drafted = drafted || e.n_draft > 0;
        }
        if (drafted) {
            Napi::Array runs = Napi::Array::New(env, entries.size());
            for (size_t i = 0; i < entries.size(); i++) {
                if (entries[i].n_draft == 0) {
                    runs.Set((uint32_t) i, env.Null());
                    continue;
                }
                Napi::Int32Array run = Napi::Int32Array::New(env, entries[i].run.size());
                memcpy(run.Data(), entries[i].run.data(), entries[i].run.size() * sizeof(llama_token));
                runs.Set((uint32_t) i, run);
            }
            out.Set("runs", runs);
        }
        bool probed = false;
        for (const decode_entry & e : entries) {
            probed = probed || e.n_probs > 0;
        }
        if (probed) {
            Napi::Array probs = Napi::Array::New(env, entries.size());
            for (size_t i = 0; i < entries.size(); i++) {
                const decode_entry & e = entries[i];
                if (e.n_probs == 0) {
                    probs.Set((uint32_t) i, env.Null());
                    continue;
                }
                Napi::Object o = Napi::Object::New(env);
                o.Set("prob", Napi::Number::New(env, e.prob));
                Napi::Int32Array ids = Napi::Int32Array::New(env, e.top_ids.size());
                memcpy(ids.Data(), e.top_ids.data(), e.top_ids.size() * sizeof(llama_token));
                Napi::Float32Array ps = Napi::Float32Array::New(env, e.top_probs.size());
                memcpy(ps.Data(), e.top_probs.data(), e.top_probs.size() * sizeof(float));
                o.Set("ids", ids);
                o.Set("probs", ps);
                probs.Set((uint32_t) i, o);
            }
            out.Set("probs", probs);
        }
        bool checkpointed = false;
        for (const decode_entry & e : entries) {
            checkpointed = checkpointed || e.checkpoint;
        }
        if (checkpointed) {
            Napi::Array states = Napi::Array::New(env, entries.size());
            for (size_t i = 0; i < entries.size(); i++) {
                const decode_entry & e = entries[i];
                states.Set((uint32_t) i, e.checkpoint && !e.state.empty() ? Napi::Buffer<uint8_t>::Copy(env, e.state.data(), e.state.size()).As<Napi::Value>() : env.Null());
            }
            out.Set("checkpoints", states);
        }
        deferred.Resolve(out);
    }

    Napi::Promise::Deferred deferred;
    hydra_context * c;
    std::vector<decode_entry> entries;
    std::vector<Napi::Reference<Napi::Value>> refs;  // keep context and samplers alive
    std::string failed;
    int32_t status = 0;
};

// An operation that needs the context alone: no other one running, no decode step queued.
static void context_claim(Napi::Env env, hydra_context * c) {
    bool expected = false;
    if (c->pending > 0 || !c->busy.compare_exchange_strong(expected, true)) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "context is busy with another operation");
    }
}

// decodeStep(ctx, [{seq, pos, tokens: Int32Array, sampler?, logits?, draft?, probs?, postSampling?}])
//   -> {tokens: Int32Array, logits, runs?, probs?}
static Napi::Value decode_step(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    hydra_context * c = hydra_handle_get<hydra_context>(info[0], "context");
    Napi::Array list = info[1].As<Napi::Array>();
    std::vector<decode_entry> entries;
    std::vector<Napi::Reference<Napi::Value>> refs;
    refs.push_back(Napi::Persistent(info[0]));
    uint32_t n_seq_max = llama_n_seq_max(c->ctx);
    for (uint32_t i = 0; i < list.Length(); i++) {
        Napi::Object o = list.Get(i).As<Napi::Object>();
        decode_entry e;
        e.seq = (llama_seq_id) arg_number(o, "seq", 0);
        e.pos = (llama_pos) arg_number(o, "pos", 0);
        if (e.seq < 0 || (uint32_t) e.seq >= n_seq_max) {
            hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "seq " + std::to_string(e.seq) + " is outside 0.." + std::to_string(n_seq_max - 1));
        }
        e.follow = arg_bool(o, "follow", false);
        if (!e.follow) {
            Napi::Value tv = o.Get("tokens");
            if (!tv.IsTypedArray() || tv.As<Napi::TypedArray>().TypedArrayType() != napi_int32_array || tv.As<Napi::Int32Array>().ElementLength() == 0) {
                hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "an entry of decodeStep has no tokens (an Int32Array, or follow: true)");
            }
            Napi::Int32Array t = tv.As<Napi::Int32Array>();
            e.tokens.assign(t.Data(), t.Data() + t.ElementLength());
        }
        Napi::Value sv = o.Get("sampler");
        if (!sv.IsUndefined() && !sv.IsNull()) {
            e.sampler = hydra_handle_get<hydra_sampler>(sv, "sampler");
            refs.push_back(Napi::Persistent(sv));
        }
        e.want_logits = arg_bool(o, "logits", false);
        if (e.follow && e.sampler == nullptr) {
            hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "an entry with follow: true needs a sampler (it feeds the sampled token)");
        }
        double n_probs = arg_number(o, "probs", 0);
        if (!(n_probs >= 0 && n_probs <= (1 << 20) && n_probs == std::floor(n_probs)) || (n_probs > 0 && e.sampler == nullptr)) {
            hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "an entry's probs must be an integer in 0..1048576, and above 0 it needs a sampler");
        }
        e.n_probs = (int32_t) n_probs;
        e.post_sampling = arg_bool(o, "postSampling", false);
        e.n_draft = (int32_t) arg_number(o, "draft", 0);
        if (e.n_draft != 0 && e.n_probs > 0) {
            hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "an entry with draft: N cannot ask for probs (llama-server reports none for drafted tokens)");
        }
        if (e.n_draft != 0) {
            if (e.follow || e.sampler == nullptr || e.want_logits || e.n_draft < 0 || (size_t) e.n_draft >= e.tokens.size() || (int32_t) e.tokens.size() > c->n_batch) {
                hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "an entry with draft: N needs a sampler, no follow or logits, more than N tokens and at most n_batch");
            }
        }
        e.checkpoint = arg_bool(o, "checkpoint", false);
        entries.push_back(std::move(e));
    }
    if (c->busy.load()) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "context is busy with another operation");
    }
    auto * job = new decode_job(env, c, std::move(entries), std::move(refs));
    Napi::Promise p = job->promise();
    if (c->pending++ == 0) {
        c->done.Ref(env);
    }
    c->runner->post([c, job] {
        job->execute();
        c->done.BlockingCall(job, decode_job::settle);
    });
    return p;
}

// ---------------------------------------------------------------------------------------------
// KV sequence ops (quick, JS thread) and per-sequence state (AsyncWorker)

static Napi::Value memory_seq_rm(const Napi::CallbackInfo & info) {
    hydra_context * c = hydra_handle_get<hydra_context>(info[0], "context");
    context_check_idle(info.Env(), c);
    bool ok = llama_memory_seq_rm(llama_get_memory(c->ctx), info[1].ToNumber().Int32Value(), info[2].ToNumber().Int32Value(), info[3].ToNumber().Int32Value());
    return Napi::Boolean::New(info.Env(), ok);
}

// memorySeqAdd(ctx, seq, p0, p1, delta): positions [p0, p1) move by delta (a context shift).
static Napi::Value memory_seq_add(const Napi::CallbackInfo & info) {
    hydra_context * c = hydra_handle_get<hydra_context>(info[0], "context");
    context_check_idle(info.Env(), c);
    llama_memory_t mem = llama_get_memory(c->ctx);
    if (!llama_memory_can_shift(mem)) {
        hydra_error_throw(info.Env(), HYDRA_ERR_BAD_ARGUMENT, "this context's memory cannot shift positions (llama_memory_can_shift)");
    }
    llama_memory_seq_add(mem, info[1].ToNumber().Int32Value(), info[2].ToNumber().Int32Value(), info[3].ToNumber().Int32Value(), info[4].ToNumber().Int32Value());
    return info.Env().Undefined();
}

static Napi::Value memory_can_shift(const Napi::CallbackInfo & info) {
    hydra_context * c = hydra_handle_get<hydra_context>(info[0], "context");
    return Napi::Boolean::New(info.Env(), llama_memory_can_shift(llama_get_memory(c->ctx)));
}

static Napi::Value memory_seq_cp(const Napi::CallbackInfo & info) {
    hydra_context * c = hydra_handle_get<hydra_context>(info[0], "context");
    context_check_idle(info.Env(), c);
    llama_memory_seq_cp(llama_get_memory(c->ctx), info[1].ToNumber().Int32Value(), info[2].ToNumber().Int32Value(), info[3].ToNumber().Int32Value(), info[4].ToNumber().Int32Value());
    return info.Env().Undefined();
}

static Napi::Value memory_seq_pos_max(const Napi::CallbackInfo & info) {
    hydra_context * c = hydra_handle_get<hydra_context>(info[0], "context");
    context_check_idle(info.Env(), c);
    return Napi::Number::New(info.Env(), llama_memory_seq_pos_max(llama_get_memory(c->ctx), info[1].ToNumber().Int32Value()));
}

static Napi::Value memory_clear(const Napi::CallbackInfo & info) {
    hydra_context * c = hydra_handle_get<hydra_context>(info[0], "context");
    context_check_idle(info.Env(), c);
    llama_memory_clear(llama_get_memory(c->ctx), true);
    return info.Env().Undefined();
}

class state_worker : public Napi::AsyncWorker {
public:
    state_worker(Napi::Env env, hydra_context * c, Napi::Value ctx_handle, llama_seq_id seq, std::vector<uint8_t> in, bool set, llama_state_seq_flags flags = 0)
        : Napi::AsyncWorker(env), deferred(Napi::Promise::Deferred::New(env)), c(c), seq(seq), data(std::move(in)), set(set), flags(flags) {
        ref = Napi::Persistent(ctx_handle);
    }
    Napi::Promise promise() { return deferred.Promise(); }
    void Execute() override {
        c->runner->run([this] { transfer(); });
    }

    void transfer() {
        if (set) {
            n = llama_state_seq_set_data_ext(c->ctx, data.data(), data.size(), seq, flags);
            if (n == 0) SetError("the state does not fit this context or is corrupt");
        } else {
            data.resize(llama_state_seq_get_size_ext(c->ctx, seq, flags));
            n = llama_state_seq_get_data_ext(c->ctx, data.data(), data.size(), seq, flags);
            if (n == 0) SetError("could not read the sequence state");
            data.resize(n);
        }
    }
    void OnOK() override {
        c->busy = false;
        if (set) deferred.Resolve(Napi::Number::New(Env(), (double) n));
        else deferred.Resolve(Napi::Buffer<uint8_t>::Copy(Env(), data.data(), data.size()));
    }
    void OnError(const Napi::Error & e) override {
        c->busy = false;
        deferred.Reject(hydra_error_make(Env(), HYDRA_ERR_STATE_FAILED, e.Message()).Value());
    }

private:
    Napi::Promise::Deferred deferred;
    Napi::Reference<Napi::Value> ref;
    hydra_context * c;
    llama_seq_id seq;
    std::vector<uint8_t> data;
    bool set;
    llama_state_seq_flags flags;
    size_t n = 0;
};

// Optional last argument of stateSeqGet/Set: {partial: true} moves only the part of the memory that
// cannot be rolled back (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: a hybrid's recurrent state, not its KV).
static llama_state_seq_flags state_flags_arg(const Napi::Value & v) {
    if (v.IsUndefined() || v.IsNull()) {
        return 0;
    }
    if (!v.IsObject()) {
        hydra_error_throw(v.Env(), HYDRA_ERR_BAD_ARGUMENT, "state options must be an object ({partial?: boolean})");
    }
    return arg_bool(v.As<Napi::Object>(), "partial", false) ? LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY : 0;
}

static Napi::Value state_seq_get(const Napi::CallbackInfo & info) {
    hydra_context * c = hydra_handle_get<hydra_context>(info[0], "context");
    llama_state_seq_flags flags = state_flags_arg(info[2]);
    context_claim(info.Env(), c);
    auto * w = new state_worker(info.Env(), c, info[0], info[1].ToNumber().Int32Value(), {}, false, flags);
    Napi::Promise p = w->promise();
    w->Queue();
    return p;
}

static Napi::Value state_seq_set(const Napi::CallbackInfo & info) {
    hydra_context * c = hydra_handle_get<hydra_context>(info[0], "context");
    Napi::Uint8Array buf = info[2].As<Napi::Uint8Array>();
    std::vector<uint8_t> copy(buf.Data(), buf.Data() + buf.ByteLength());
    llama_state_seq_flags flags = state_flags_arg(info[3]);
    context_claim(info.Env(), c);
    auto * w = new state_worker(info.Env(), c, info[0], info[1].ToNumber().Int32Value(), std::move(copy), true, flags);
    Napi::Promise p = w->promise();
    w->Queue();
    return p;
}

// ---------------------------------------------------------------------------------------------

static Napi::Object hydra_init(Napi::Env env, Napi::Object exports) {
    exports.Set("backendInit", Napi::Function::New(env, backend_init));
    exports.Set("exitNow", Napi::Function::New(env, exit_now));
    exports.Set("devicesList", Napi::Function::New(env, devices_list));
    exports.Set("devicesDescribe", Napi::Function::New(env, devices_describe));
    exports.Set("rpcServerAdd", Napi::Function::New(env, rpc_server_add));
    exports.Set("modelLoad", Napi::Function::New(env, model_load));
    exports.Set("modelInfo", Napi::Function::New(env, model_info));
    exports.Set("modelFree", Napi::Function::New(env, model_free));
    exports.Set("tokenIsEog", Napi::Function::New(env, token_is_eog));
    exports.Set("tokenize", Napi::Function::New(env, tokenize));
    exports.Set("tokenToPiece", Napi::Function::New(env, token_to_piece));
    exports.Set("detokenize", Napi::Function::New(env, detokenize));
    exports.Set("chatApplyTemplate", Napi::Function::New(env, chat_apply_template));
    exports.Set("tokenizeAsync", Napi::Function::New(env, tokenize_async));
    exports.Set("chatApplyTemplateAsync", Napi::Function::New(env, chat_apply_template_async));
    exports.Set("chatApplyTemplatePackedAsync", Napi::Function::New(env, chat_apply_template_packed_async));
    exports.Set("chatTokenizePackedAsync", Napi::Function::New(env, chat_tokenize_packed_async));
    exports.Set("contextCreate", Napi::Function::New(env, context_create));
    exports.Set("contextFree", Napi::Function::New(env, context_free));
    exports.Set("contextInfo", Napi::Function::New(env, context_info));
    exports.Set("contextMemory", Napi::Function::New(env, context_memory));
    exports.Set("samplerCreate", Napi::Function::New(env, sampler_create));
    exports.Set("samplerFree", Napi::Function::New(env, sampler_free));
    exports.Set("samplerAccept", Napi::Function::New(env, sampler_accept));
    exports.Set("samplerNames", Napi::Function::New(env, sampler_names));
    exports.Set("jsonSchemaToGrammar", Napi::Function::New(env, json_schema_to_grammar_js));
    exports.Set("chatCommonApplyAsync", Napi::Function::New(env, hydra_chat_common_apply_async));
    exports.Set("chatCommonParseAsync", Napi::Function::New(env, hydra_chat_common_parse_async));
    exports.Set("decodeStep", Napi::Function::New(env, decode_step));
    exports.Set("memorySeqRm", Napi::Function::New(env, memory_seq_rm));
    exports.Set("memorySeqAdd", Napi::Function::New(env, memory_seq_add));
    exports.Set("memoryCanShift", Napi::Function::New(env, memory_can_shift));
    exports.Set("memorySeqCp", Napi::Function::New(env, memory_seq_cp));
    exports.Set("memorySeqPosMax", Napi::Function::New(env, memory_seq_pos_max));
    exports.Set("memoryClear", Napi::Function::New(env, memory_clear));
    exports.Set("stateSeqGet", Napi::Function::New(env, state_seq_get));
    exports.Set("stateSeqSet", Napi::Function::New(env, state_seq_set));
    hydra_rpc_serve_init(env, exports);
    hydra_combine_init(env, exports);
    hydra_embed_init(env, exports);
    hydra_draft_init(env, exports);
    hydra_ngram_init(env, exports);
    return exports;
}

NODE_API_MODULE(hydra_ggml, hydra_init)
