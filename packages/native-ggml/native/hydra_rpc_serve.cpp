// The native half of the merged port: peek the first byte of a connection without consuming it,
// take a connection over from Node (dup), and serve one ggml-RPC session on it.
#include "hydra_common.h"
#include "hydra_rpc_guard.h"

#include "ggml-rpc.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <thread>

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <linux/tcp.h>  // struct tcp_info with byte counters (glibc's copy lacks them)
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

// ---------------------------------------------------------------------------------------------
// peek: one poller thread waits for every pending first byte, so idle connections never occupy
// libuv's small thread pool (which decode and file I/O need).

struct peek_request {
    int fd;
    std::chrono::steady_clock::time_point deadline;
    Napi::ThreadSafeFunction tsfn;
    Napi::Promise::Deferred * deferred;
};

struct peek_result {
    Napi::Promise::Deferred * deferred;
    int value;
};

class peek_poller {
public:
    static peek_poller & get() {
        static peek_poller * instance = new peek_poller();  // never destroyed: the thread outlives exit
        return *instance;
    }

    bool add(peek_request req) {
        std::lock_guard<std::mutex> lock(mutex);
        epoll_event ev = {};
        ev.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
        ev.data.fd = req.fd;
        if (pending.count(req.fd) || epoll_ctl(epfd, EPOLL_CTL_ADD, req.fd, &ev) != 0) {
            return false;
        }
        pending.emplace(req.fd, std::move(req));
        uint64_t one = 1;
        (void) !write(wakefd, &one, sizeof(one));
        return true;
    }

private:
    peek_poller() {
        epfd = epoll_create1(EPOLL_CLOEXEC);
        wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        epoll_event ev = {};
        ev.events = EPOLLIN;
        ev.data.fd = wakefd;
        epoll_ctl(epfd, EPOLL_CTL_ADD, wakefd, &ev);
        std::thread([this] { run(); }).detach();
    }

    static void finish(peek_request & req, int value) {
        auto * result = new peek_result{req.deferred, value};
        req.tsfn.BlockingCall(result, [](Napi::Env env, Napi::Function, peek_result * r) {
            r->deferred->Resolve(Napi::Number::New(env, r->value));
            delete r->deferred;
            delete r;
        });
        req.tsfn.Release();
    }

    void run() {
        epoll_event events[64];
        while (true) {
            int timeout_ms = -1;
            {
                std::lock_guard<std::mutex> lock(mutex);
                auto now = std::chrono::steady_clock::now();
                for (auto & [fd, req] : pending) {
                    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(req.deadline - now).count();
                    int ms = (int) std::max<int64_t>(0, left);
                    timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
                }
            }
            int n = epoll_wait(epfd, events, 64, timeout_ms);
            std::vector<std::pair<peek_request, int>> done;
            {
                std::lock_guard<std::mutex> lock(mutex);
                for (int i = 0; i < n; i++) {
                    int fd = events[i].data.fd;
                    if (fd == wakefd) {
                        uint64_t v;
                        (void) !read(wakefd, &v, sizeof(v));
                        continue;
                    }
                    auto it = pending.find(fd);
                    if (it == pending.end()) {
                        continue;
                    }
                    uint8_t byte = 0;
                    ssize_t got = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
                    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
                        epoll_event ev = {};
                        ev.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
                        ev.data.fd = fd;
                        epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &ev);
                        continue;
                    }
                    epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
                    done.emplace_back(std::move(it->second), got == 1 ? (int) byte : -1);
                    pending.erase(it);
                }
                auto now = std::chrono::steady_clock::now();
                for (auto it = pending.begin(); it != pending.end();) {
                    if (it->second.deadline <= now) {
                        epoll_ctl(epfd, EPOLL_CTL_DEL, it->first, nullptr);
                        done.emplace_back(std::move(it->second), -1);
                        it = pending.erase(it);
                    } else {
                        ++it;
                    }
                }
            }
            for (auto & [req, value] : done) {
                finish(req, value);
            }
        }
    }

    int epfd = -1;
    int wakefd = -1;
    std::mutex mutex;
    std::map<int, peek_request> pending;
};

// peekFirstByte(fd, timeoutMs) -> Promise<number>: the first byte (still unread), or -1 on
// EOF, error or timeout.
static Napi::Value peek_first_byte(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    int fd = info[0].ToNumber().Int32Value();
    int timeout_ms = info.Length() > 1 ? info[1].ToNumber().Int32Value() : 5000;
    if (fd < 0) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "fd must be a non-negative integer");
    }
    // The first bytes usually arrived with the connection (ggml-RPC clients send HELLO at once):
    // answer without the poller thread and its hop back to the JS thread.
    uint8_t byte = 0;
    ssize_t got = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (got == 1 || got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        Napi::Promise::Deferred now = Napi::Promise::Deferred::New(env);
        now.Resolve(Napi::Number::New(env, got == 1 ? (int) byte : -1));
        return now.Promise();
    }
    auto * deferred = new Napi::Promise::Deferred(env);
    Napi::Promise promise = deferred->Promise();
    peek_request req;
    req.fd = fd;
    req.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(0, timeout_ms));
    req.tsfn = Napi::ThreadSafeFunction::New(env, Napi::Function::New(env, [](const Napi::CallbackInfo &) {}), "hydra_peek", 0, 1);
    req.deferred = deferred;
    if (!peek_poller::get().add(std::move(req))) {
        deferred->Reject(hydra_error_make(env, HYDRA_ERR_BAD_ARGUMENT, "fd " + std::to_string(fd) + " cannot be polled (already pending or not a socket)").Value());
        delete deferred;
    }
    return promise;
}

// detachFd(fd) -> fd2: a blocking duplicate with TCP_NODELAY. The caller destroys Node's socket
// next, leaving fd2 the only owner of the connection.
static Napi::Value detach_fd(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    int fd = info[0].ToNumber().Int32Value();
    int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup_fd < 0) {
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, std::string("dup failed: ") + strerror(errno));
    }
    int flags = fcntl(dup_fd, F_GETFL, 0);
    fcntl(dup_fd, F_SETFL, flags & ~O_NONBLOCK);
    int one = 1;
    setsockopt(dup_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return Napi::Number::New(env, dup_fd);
}

static Napi::Value fd_close(const Napi::CallbackInfo & info) {
    close(info[0].ToNumber().Int32Value());
    return info.Env().Undefined();
}

// Ends a served session from outside its worker (shutdown, not close: the worker still owns fd);
// its blocking recv returns and the session unwinds normally.
static Napi::Value fd_shutdown(const Napi::CallbackInfo & info) {
    shutdown(info[0].ToNumber().Int32Value(), SHUT_RDWR);
    return info.Env().Undefined();
}

// fdTcpBytes(fd) -> [bytesIn, bytesOut], or undefined when fd is no TCP socket: the kernel's
// counters of a session still being served (its host reports them while it runs).
static Napi::Value fd_tcp_bytes(const Napi::CallbackInfo & info) {
    struct tcp_info ti = {};
    socklen_t len = sizeof(ti);
    if (getsockopt(info[0].ToNumber().Int32Value(), IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) {
        return info.Env().Undefined();
    }
    Napi::Array out = Napi::Array::New(info.Env(), 2);
    out.Set((uint32_t) 0, Napi::Number::New(info.Env(), (double) ti.tcpi_bytes_received));
    out.Set((uint32_t) 1, Napi::Number::New(info.Env(), (double) ti.tcpi_bytes_acked));
    return out;
}

static bool device_is_rpc(ggml_backend_dev_t dev) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    return reg != nullptr && strcmp(ggml_backend_reg_name(reg), "RPC") == 0;
}

// The devices served by default: every local GPU, or the CPU when there is none (as upstream
// rpc-server chooses). Remote (RPC) devices are never re-served.
static std::vector<ggml_backend_dev_t> serve_devices_default() {
    std::vector<ggml_backend_dev_t> gpus, cpus;
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (device_is_rpc(dev)) {
            continue;
        }
        auto type = ggml_backend_dev_type(dev);
        if (type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU) {
            gpus.push_back(dev);
        } else if (type == GGML_BACKEND_DEVICE_TYPE_CPU) {
            cpus.push_back(dev);
        }
    }
    return gpus.empty() ? cpus : gpus;
}

// Backends of the served devices, created once per worker thread and reused by its sessions (one
// at a time): creating a CUDA backend per connection would cost milliseconds on every HELLO, and a
// ggml_backend_t is never shared between threads.
struct serve_backends {
    std::vector<ggml_backend_dev_t> devices;
    size_t threads = 0;
    std::vector<ggml_backend_t> backends;
    ~serve_backends() { release(); }
    void release() {
        for (auto b : backends) {
            ggml_backend_free(b);
        }
        backends.clear();
    }
    bool prepare(const std::vector<ggml_backend_dev_t> & want, size_t n_threads) {
        if (want == devices && n_threads == threads && !backends.empty()) {
            return true;
        }
        release();
        devices = want;
        threads = n_threads;
        for (ggml_backend_dev_t dev : want) {
            ggml_backend_t backend = ggml_backend_dev_init(dev, nullptr);
            if (backend == nullptr) {
                release();
                return false;
            }
            ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
            auto set_n_threads = reg ? (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads") : nullptr;
            if (set_n_threads) {
                set_n_threads(backend, (int) n_threads);
            }
            backends.push_back(backend);
        }
        return true;
    }
};
static thread_local serve_backends t_serve_backends;
thread_local bool t_rpc_serving = false;

// Upstream's half of a guarded session: serve_fd on our end of the socketpair, in a thread of its
// own with a stack that the guard's depth bound keeps far from full.
struct upstream_session {
    int fd;
    const char * cache_dir;
    std::vector<ggml_backend_t> * backends;
    ggml_backend_rpc_serve_stats * stats;
    hydra_rpc_hash_bound * bound;
    bool ok = false;
    std::string error;
};

static void * upstream_session_main(void * arg) {
    auto * s = static_cast<upstream_session *>(arg);
    t_rpc_serving = true;
    try {
        s->ok = ggml_backend_rpc_serve_fd(s->fd, s->cache_dir, s->backends->size(), s->backends->data(), s->stats,
                                          hydra_rpc_guarded_resolve, s->bound);
    } catch (const std::exception & e) {
        // An upstream assert or an uncaught std exception on input the guard let through: the
        // session unwound and its socket closed.
        s->ok = true;
        s->error = e.what();
        fprintf(stderr, "hydra: ended a ggml-RPC session on bad input: %s\n", e.what());
    }
    t_rpc_serving = false;
    return nullptr;
}

static const char * const k_limit_keys[] = {"maxAllocBytes", "maxMessageBytes", "maxGraphNodes", "maxGraphTensors",
                                            "maxGraphDepth", "maxBuffers", "helloTimeoutMs", "stallTimeoutMs",
                                            "idleTimeoutMs"};

// A limit option: absent keeps the default; otherwise a positive integer (idleTimeoutMs may be 0:
// never), anything else is refused by name.
static bool read_limit(Napi::Env env, Napi::Object opts, const char * key, uint64_t max, uint64_t & out, std::string & err) {
    Napi::Value v = opts.Get(key);
    if (v.IsUndefined()) {
        return true;
    }
    double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
    bool zero_ok = strcmp(key, "idleTimeoutMs") == 0;
    if (!v.IsNumber() || d != (double) (uint64_t) d || d < (zero_ok ? 0 : 1) || d > (double) max) {
        err = std::string("options.") + key + " must be a " + (zero_ok ? "non-negative" : "positive") + " integer";
        return false;
    }
    out = (uint64_t) d;
    (void) env;
    return true;
}

static bool read_limits(Napi::Env env, Napi::Object opts, hydra_rpc_limits & L, std::string & err) {
    Napi::Array keys = opts.GetPropertyNames();
    for (uint32_t i = 0; i < keys.Length(); i++) {
        std::string k = keys.Get(i).ToString().Utf8Value();
        bool known = k == "devices" || k == "threads" || k == "cacheDir";
        for (const char * lk : k_limit_keys) {
            known |= k == lk;
        }
        if (!known) {
            err = "options." + k + " is not a serveRpcFd option";
            return false;
        }
    }
    uint64_t v;
    const uint64_t u32max = UINT32_MAX, ms_max = INT32_MAX;
#define LIMIT(key, field, max) \
    v = L.field;               \
    if (!read_limit(env, opts, key, max, v, err)) return false; \
    L.field = (decltype(L.field)) v;
    LIMIT("maxAllocBytes", max_alloc_bytes, (uint64_t) 1 << 53)
    LIMIT("maxMessageBytes", max_message_bytes, (uint64_t) 1 << 40)
    LIMIT("maxGraphNodes", max_graph_nodes, u32max)
    LIMIT("maxGraphTensors", max_graph_tensors, u32max)
    LIMIT("maxGraphDepth", max_graph_depth, u32max)
    LIMIT("maxBuffers", max_buffers, u32max)
    LIMIT("helloTimeoutMs", hello_timeout_ms, ms_max)
    LIMIT("stallTimeoutMs", stall_timeout_ms, ms_max)
    LIMIT("idleTimeoutMs", idle_timeout_ms, ms_max)
#undef LIMIT
    return true;
}

// serveRpcFd(fd, {devices?, threads?, cacheDir?, ...limits}, stats?: BigUint64Array(3)) -> session
// summary. Blocks until the client leaves: call it from a worker thread only. Takes ownership of fd.
// Every client message passes the guard (hydra_rpc_guard.cpp) before upstream reads it.
static Napi::Value serve_rpc_fd(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    int fd = info[0].ToNumber().Int32Value();
    Napi::Object opts = info.Length() > 1 && info[1].IsObject() ? info[1].As<Napi::Object>() : Napi::Object::New(env);
    hydra_rpc_limits limits;
    std::string limit_error;
    if (!read_limits(env, opts, limits, limit_error)) {
        close(fd);
        hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, limit_error);
    }
    std::vector<ggml_backend_dev_t> devices;
    Napi::Value names = opts.Get("devices");
    if (names.IsArray() && names.As<Napi::Array>().Length() > 0) {
        Napi::Array a = names.As<Napi::Array>();
        for (uint32_t i = 0; i < a.Length(); i++) {
            std::string name = a.Get(i).ToString().Utf8Value();
            ggml_backend_dev_t dev = ggml_backend_dev_by_name(name.c_str());
            if (dev == nullptr || device_is_rpc(dev)) {
                close(fd);
                hydra_error_throw(env, HYDRA_ERR_NO_DEVICE, "no local device named " + name);
            }
            devices.push_back(dev);
        }
    } else {
        devices = serve_devices_default();
    }
    size_t threads = (size_t) (opts.Get("threads").IsNumber() ? opts.Get("threads").As<Napi::Number>().Int64Value() : std::max(1u, std::thread::hardware_concurrency()));
    std::string cache_dir = opts.Get("cacheDir").IsString() ? opts.Get("cacheDir").As<Napi::String>().Utf8Value() : "";

    ggml_backend_rpc_serve_stats local = {};
    ggml_backend_rpc_serve_stats * stats = &local;
    if (info.Length() > 2 && info[2].IsTypedArray()) {
        Napi::TypedArray ta = info[2].As<Napi::TypedArray>();
        if (ta.TypedArrayType() != napi_biguint64_array || ta.ElementLength() < 3) {
            close(fd);
            hydra_error_throw(env, HYDRA_ERR_BAD_ARGUMENT, "stats must be a BigUint64Array of at least 3 elements");
        }
        // Often backed by a SharedArrayBuffer so the main thread reads the counters live.
        stats = reinterpret_cast<ggml_backend_rpc_serve_stats *>(info[2].As<Napi::BigUint64Array>().Data());
    }
    auto started = std::chrono::steady_clock::now();
    bool prepared = t_serve_backends.prepare(devices, threads) && !t_serve_backends.backends.empty();
    int pair[2] = {-1, -1};
    if (prepared && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
        prepared = false;
    }
    hydra_rpc_guard_outcome outcome;
    hydra_rpc_hash_bound bound;
    upstream_session session{pair[1], cache_dir.empty() ? nullptr : cache_dir.c_str(), &t_serve_backends.backends, stats, &bound};
    if (prepared) {
        // Large socket buffers keep a weight upload streaming while upstream copies the last chunk.
        int sz = 4 << 20;
        for (int s : pair) {
            setsockopt(s, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
            setsockopt(s, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
        }
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 64u << 20);
        pthread_t upstream;
        if (pthread_create(&upstream, &attr, upstream_session_main, &session) != 0) {
            close(pair[1]);
            prepared = false;
        } else {
            hydra_rpc_guard_run(fd, pair[0], t_serve_backends.backends, limits, session.cache_dir, &bound, &stats->n_cmds, outcome);
            // EOF on its socket unwinds upstream's loop once it finishes what it is computing
            shutdown(pair[0], SHUT_RDWR);
            pthread_join(upstream, nullptr);
        }
        pthread_attr_destroy(&attr);
        close(pair[0]);
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    struct tcp_info ti = {};
    socklen_t len = sizeof(ti);
    bool have_tcp = getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0;
    close(fd);
    if (!prepared || !session.ok) {
        hydra_error_throw(env, HYDRA_ERR_SERVE_FAILED, "could not create a backend for the served devices");
    }
    Napi::Object out = Napi::Object::New(env);
    out.Set("commands", Napi::Number::New(env, (double) stats->n_cmds));
    out.Set("setTensorBytes", Napi::Number::New(env, (double) stats->set_tensor_bytes));
    out.Set("setTensorHashHits", Napi::Number::New(env, (double) stats->set_tensor_hash_hits));
    out.Set("bytesIn", Napi::Number::New(env, have_tcp ? (double) ti.tcpi_bytes_received : -1));
    out.Set("bytesOut", Napi::Number::New(env, have_tcp ? (double) ti.tcpi_bytes_acked : -1));
    out.Set("durationMs", Napi::Number::New(env, ms));
    if (!session.error.empty()) {
        out.Set("error", session.error);
    }
    out.Set("ended", outcome.ended);
    if (outcome.ended == "refused" || outcome.ended == "timeout") {
        out.Set("reason", outcome.reason);
    }
    if (outcome.ended == "refused") {
        out.Set("refusedCommand", outcome.command);
    }
    // 0 with ended "client": the client left (or its connection broke) before its HELLO was answered.
    out.Set("messages", Napi::Number::New(env, (double) outcome.messages));
    out.Set("refusals", Napi::Number::New(env, (double) outcome.refusals));
    out.Set("allocDenied", Napi::Number::New(env, (double) outcome.alloc_denied));
    out.Set("allocBytesPeak", Napi::Number::New(env, (double) outcome.alloc_bytes_peak));
    Napi::Array served = Napi::Array::New(env);
    for (size_t i = 0; i < devices.size(); i++) {
        served.Set((uint32_t) i, ggml_backend_dev_name(devices[i]));
    }
    out.Set("devices", served);
    return out;
}

void hydra_rpc_serve_init(Napi::Env env, Napi::Object exports) {
    exports.Set("peekFirstByte", Napi::Function::New(env, peek_first_byte));
    exports.Set("detachFd", Napi::Function::New(env, detach_fd));
    exports.Set("fdClose", Napi::Function::New(env, fd_close));
    exports.Set("fdShutdown", Napi::Function::New(env, fd_shutdown));
    exports.Set("fdTcpBytes", Napi::Function::New(env, fd_tcp_bytes));
    exports.Set("serveRpcFd", Napi::Function::New(env, serve_rpc_fd));
}
