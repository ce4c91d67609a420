// Per-peer accounting of a head's ggml-RPC client path, with no upstream patch and no parsing of
// the wire. Two sources:
//  - ggml's backend interfaces are tables of function pointers held by value in every device,
//    buffer type, buffer and backend object (ggml-backend-impl.h, the API backends implement).
//    Once a peer is registered, its RPC devices get an init_backend that returns backends whose
//    graph_compute / set_tensor_async / get_tensor_async / synchronize count and
//    time the call before calling upstream's own function, and its buffer type an alloc_buffer
//    whose buffers do the same for set/get/copy/memset/clear/init. Each upstream client call maps
//    to one wire command (the mapping is in rpc_cmd_of below), so the counts are the commands the
//    head sent, and the time a calling thread spent inside a call that waits on the dispatcher is
//    the time the head waited on that peer. free_buffer, get_base and the buffer type's name are
//    left alone: upstream recognises its own objects by them (ggml_backend_buffer_is_rpc,
//    supports_buft).
//  - the kernel's TCP_INFO of the one socket upstream's dispatcher holds per endpoint (found once
//    in /proc/self/fd: a blocking AF_INET stream socket whose peer address is the endpoint's; the
//    engine's own probes are non-blocking Node sockets), for the bytes and segments that really
//    crossed, and the kernel's RTT estimate.
// Local devices (CPU, GPUs) get the same graph_compute / synchronize timing, so a step's local
// compute can be told from its waits. Cost per call: two steady_clock reads and a few relaxed
// atomic adds; a decode step makes a few such calls per split.
#include "hydra_common.h"

#include "ggml-backend-impl.h"
#include "ggml-backend.h"
#include "ggml-impl.h"

#include <chrono>
#include <cstring>

#include <dirent.h>
#include <fcntl.h>
#include <linux/tcp.h>  // struct tcp_info with byte counters (glibc's copy lacks them)
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

// Upstream's HASH_THRESHOLD (ggml-rpc.cpp, not exported): a set above it first asks SET_TENSOR_HASH.
constexpr size_t k_hash_threshold = 10 * 1024 * 1024;

enum cmd_kind : int {
    K_SET_TENSOR = 0,
    K_SET_TENSOR_HASH,
    K_GET_TENSOR,
    K_COPY_TENSOR,
    K_GRAPH_COMPUTE,
    K_GRAPH_RECOMPUTE,
    K_MEMSET_TENSOR,
    K_BUFFER_CLEAR,
    K_INIT_TENSOR,
    K_ALLOC_BUFFER,
    K_COUNT,
};
const char * const k_cmd_names[K_COUNT] = {
    "set_tensor",    "set_tensor_hash", "get_tensor",    "copy_tensor", "graph_compute",
    "graph_recompute", "memset_tensor", "buffer_clear",  "init_tensor", "alloc_buffer",
};
// Commands the server answers: the client's dispatcher reads a reply before the next one.
constexpr bool k_cmd_replied[K_COUNT] = {false, true, true, true, false, false, false, false, false, true};

using clk = std::chrono::steady_clock;
inline uint64_t now_ns() {
    return (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now().time_since_epoch()).count();
}

struct peer_stats {
    std::string endpoint;
    in_addr     addr{};
    uint16_t    port = 0;
    bool        resolved = false;
    std::atomic<uint64_t> cmds[K_COUNT] = {};
    std::atomic<uint64_t> cmd_bytes[K_COUNT] = {};  // payload offered by the head (set) or asked for (get)
    // Time the calling thread spent inside calls that block until the dispatcher is done: waiting
    // for a reply (get, copy, hash, alloc, synchronize, event_synchronize) or for a send (sync set,
    // memset, clear, init).
    std::atomic<uint64_t> wait_reply_ns{0}, wait_reply_calls{0};
    std::atomic<uint64_t> wait_send_ns{0}, wait_send_calls{0};
    // Time inside calls that only queue: graph serialization (graph_compute) and async set/get.
    std::atomic<uint64_t> serialize_ns{0}, enqueue_ns{0};
    std::atomic<uint64_t> syncs{0};
    std::atomic<uint64_t> graph_nodes{0};  // nodes of the graphs computed on the peer
    uint64_t last_graph_uid[16] = {};  // per remote device index, as upstream's device context keeps it
    std::mutex sock_mutex;             // the socket lookup below, not the hot path
    int        sock_fd = -1;
    ino_t      sock_ino = 0;
    uint64_t   sock_scanned_ns = 0;
};

struct local_stats {
    std::string device;
    std::atomic<uint64_t> compute_ns{0}, computes{0}, sync_ns{0}, syncs{0};
};

// Append-only tables read by every wrapper without a lock: entries are published by a release
// store of the count and never move or die (a device lives as long as the process).
constexpr int k_max = 64;
struct dev_entry {
    ggml_backend_dev_t dev;
    peer_stats *       peer;   // RPC devices
    local_stats *      local;  // every other device
    uint32_t           remote_index;
};
dev_entry        g_devs[k_max];
std::atomic<int> g_n_devs{0};
std::mutex       g_install_mutex;
std::vector<peer_stats *>  g_peers;   // under g_install_mutex
std::vector<local_stats *> g_locals;  // under g_install_mutex

const dev_entry * entry_of(ggml_backend_dev_t dev) {
    const int n = g_n_devs.load(std::memory_order_acquire);
    for (int i = 0; i < n; i++) {
        if (g_devs[i].dev == dev) return &g_devs[i];
    }
    return nullptr;
}

// Upstream's function pointers, the same for every RPC object (static tables in ggml-rpc.cpp);
// taken from the first device installed.
ggml_backend_t (*o_rpc_init_backend)(ggml_backend_dev_t, const char *) = nullptr;
void (*o_rpc_event_sync)(ggml_backend_dev_t, ggml_backend_event_t) = nullptr;
ggml_backend_buffer_t (*o_rpc_alloc)(ggml_backend_buffer_type_t, size_t) = nullptr;
ggml_backend_i        o_rpc_backend{};
ggml_backend_buffer_i o_rpc_buffer{};
bool                  o_rpc_backend_set = false, o_rpc_buffer_set = false;
// Local devices: one original per device (each backend registry has its own functions).
struct local_orig {
    ggml_backend_dev_t dev;
    ggml_backend_t (*init_backend)(ggml_backend_dev_t, const char *);
    enum ggml_status (*graph_compute)(ggml_backend_t, ggml_cgraph *);
    void (*synchronize)(ggml_backend_t);
};
local_orig       g_local_orig[k_max];
std::atomic<int> g_n_local_orig{0};

const local_orig * local_orig_of(ggml_backend_dev_t dev) {
    const int n = g_n_local_orig.load(std::memory_order_acquire);
    for (int i = 0; i < n; i++) {
        if (g_local_orig[i].dev == dev) return &g_local_orig[i];
    }
    return nullptr;
}

inline void add(std::atomic<uint64_t> & a, uint64_t v) { a.fetch_add(v, std::memory_order_relaxed); }

inline peer_stats * peer_of_buffer(ggml_backend_buffer_t buf) {
    const dev_entry * e = buf->buft != nullptr ? entry_of(buf->buft->device) : nullptr;
    return e != nullptr ? e->peer : nullptr;
}

inline void count(peer_stats * p, cmd_kind k, uint64_t bytes) {
    add(p->cmds[k], 1);
    add(p->cmd_bytes[k], bytes);
}

// A set above the hash threshold asks SET_TENSOR_HASH first and sends the bytes only on a miss;
// which one it was is not visible here, so the hash is counted and the set's bytes are the
// payload offered (the TCP counters show what crossed).
inline void count_set(peer_stats * p, size_t size) {
    if (size > k_hash_threshold) count(p, K_SET_TENSOR_HASH, 0);
    count(p, K_SET_TENSOR, size);
}

// --- buffers
void w_buf_set(ggml_backend_buffer_t buf, ggml_tensor * t, const void * data, size_t off, size_t size) {
    peer_stats * p = peer_of_buffer(buf);
    const uint64_t t0 = now_ns();
    o_rpc_buffer.set_tensor(buf, t, data, off, size);
    if (p == nullptr) return;
    count_set(p, size);
    const uint64_t dt = now_ns() - t0;
    if (size > k_hash_threshold) {
        add(p->wait_reply_ns, dt), add(p->wait_reply_calls, 1);
    } else {
        add(p->wait_send_ns, dt), add(p->wait_send_calls, 1);
    }
}
void w_buf_get(ggml_backend_buffer_t buf, const ggml_tensor * t, void * data, size_t off, size_t size) {
    peer_stats * p = peer_of_buffer(buf);
    const uint64_t t0 = now_ns();
    o_rpc_buffer.get_tensor(buf, t, data, off, size);
    if (p == nullptr) return;
    count(p, K_GET_TENSOR, size);
    add(p->wait_reply_ns, now_ns() - t0), add(p->wait_reply_calls, 1);
}
bool w_buf_cpy(ggml_backend_buffer_t buf, const ggml_tensor * src, ggml_tensor * dst) {
    peer_stats * p = peer_of_buffer(buf);
    const uint64_t t0 = now_ns();
    // Upstream sends COPY_TENSOR only when src is an RPC buffer of the same server; otherwise it
    // returns false at once and ggml copies through host memory (counted as a get and a set).
    const bool same = src->buffer != nullptr && src->buffer->iface.free_buffer == o_rpc_buffer.free_buffer &&
                      peer_of_buffer(src->buffer) == p;
    const bool ok = o_rpc_buffer.cpy_tensor(buf, src, dst);
    if (p != nullptr && same) {
        count(p, K_COPY_TENSOR, ggml_nbytes(dst));
        add(p->wait_reply_ns, now_ns() - t0), add(p->wait_reply_calls, 1);
    }
    return ok;
}
void w_buf_memset(ggml_backend_buffer_t buf, ggml_tensor * t, uint8_t v, size_t off, size_t size) {
    peer_stats * p = peer_of_buffer(buf);
    const uint64_t t0 = now_ns();
    o_rpc_buffer.memset_tensor(buf, t, v, off, size);
    if (p == nullptr) return;
    count(p, K_MEMSET_TENSOR, 0);
    add(p->wait_send_ns, now_ns() - t0), add(p->wait_send_calls, 1);
}
void w_buf_clear(ggml_backend_buffer_t buf, uint8_t v) {
    peer_stats * p = peer_of_buffer(buf);
    const uint64_t t0 = now_ns();
    o_rpc_buffer.clear(buf, v);
    if (p == nullptr) return;
    count(p, K_BUFFER_CLEAR, 0);
    add(p->wait_send_ns, now_ns() - t0), add(p->wait_send_calls, 1);
}
enum ggml_status w_buf_init(ggml_backend_buffer_t buf, ggml_tensor * t) {
    peer_stats * p = peer_of_buffer(buf);
    const uint64_t t0 = now_ns();
    enum ggml_status s = o_rpc_buffer.init_tensor(buf, t);
    // Upstream's condition for sending INIT_TENSOR (ggml_backend_rpc_buffer_init_tensor).
    if (p != nullptr && ggml_is_quantized(t->type) && (t->ne[0] % 512 != 0) && t->view_src == nullptr) {
        count(p, K_INIT_TENSOR, 0);
        add(p->wait_send_ns, now_ns() - t0), add(p->wait_send_calls, 1);
    }
    return s;
}

ggml_backend_buffer_t w_alloc(ggml_backend_buffer_type_t buft, size_t size) {
    const dev_entry * e = entry_of(buft->device);
    const uint64_t t0 = now_ns();
    ggml_backend_buffer_t buf = o_rpc_alloc(buft, size);
    if (e != nullptr && e->peer != nullptr) {
        count(e->peer, K_ALLOC_BUFFER, size);
        add(e->peer->wait_reply_ns, now_ns() - t0), add(e->peer->wait_reply_calls, 1);
    }
    if (buf != nullptr) {
        std::lock_guard<std::mutex> lock(g_install_mutex);
        if (!o_rpc_buffer_set) {
            o_rpc_buffer = buf->iface;
            o_rpc_buffer_set = true;
        }
        buf->iface.set_tensor = w_buf_set;
        buf->iface.get_tensor = w_buf_get;
        buf->iface.cpy_tensor = w_buf_cpy;
        buf->iface.memset_tensor = w_buf_memset;
        buf->iface.clear = w_buf_clear;
        buf->iface.init_tensor = w_buf_init;
    }
    return buf;
}

// --- RPC backends
inline const dev_entry * entry_of_backend(ggml_backend_t b) { return entry_of(b->device); }

void w_set_async(ggml_backend_t b, ggml_tensor * t, const void * data, size_t off, size_t size) {
    const dev_entry * e = entry_of_backend(b);
    const uint64_t t0 = now_ns();
    o_rpc_backend.set_tensor_async(b, t, data, off, size);
    if (e == nullptr || e->peer == nullptr) return;
    count_set(e->peer, size);
    const uint64_t dt = now_ns() - t0;
    if (size > k_hash_threshold) {
        add(e->peer->wait_reply_ns, dt), add(e->peer->wait_reply_calls, 1);  // the hash is sent synchronously
    } else {
        add(e->peer->enqueue_ns, dt);
    }
}
void w_get_async(ggml_backend_t b, const ggml_tensor * t, void * data, size_t off, size_t size) {
    const dev_entry * e = entry_of_backend(b);
    const uint64_t t0 = now_ns();
    o_rpc_backend.get_tensor_async(b, t, data, off, size);
    if (e == nullptr || e->peer == nullptr) return;
    count(e->peer, K_GET_TENSOR, size);
    add(e->peer->enqueue_ns, now_ns() - t0);
}
void w_sync(ggml_backend_t b) {
    const dev_entry * e = entry_of_backend(b);
    const uint64_t t0 = now_ns();
    o_rpc_backend.synchronize(b);
    if (e == nullptr || e->peer == nullptr) return;
    add(e->peer->syncs, 1);
    add(e->peer->wait_reply_ns, now_ns() - t0), add(e->peer->wait_reply_calls, 1);
}
enum ggml_status w_graph(ggml_backend_t b, ggml_cgraph * g) {
    const dev_entry * e = entry_of_backend(b);
    const uint64_t t0 = now_ns();
    bool reuse = false;
    if (e != nullptr && e->peer != nullptr) {
        // Upstream's own test (ggml_backend_rpc_graph_compute): the same non-zero uid as the last
        // graph of this device is sent as GRAPH_RECOMPUTE (no graph on the wire).
        uint64_t & last = e->peer->last_graph_uid[e->remote_index % 16];
        reuse = g->uid != 0 && last == g->uid;
        if (!reuse) last = g->uid;
    }
    enum ggml_status s = o_rpc_backend.graph_compute(b, g);
    if (e == nullptr || e->peer == nullptr) return s;
    count(e->peer, reuse ? K_GRAPH_RECOMPUTE : K_GRAPH_COMPUTE, 0);
    add(e->peer->graph_nodes, (uint64_t) g->n_nodes);
    add(e->peer->serialize_ns, now_ns() - t0);
    return s;
}
void w_event_sync(ggml_backend_dev_t dev, ggml_backend_event_t ev) {
    const dev_entry * e = entry_of(dev);
    const uint64_t t0 = now_ns();
    o_rpc_event_sync(dev, ev);
    if (e == nullptr || e->peer == nullptr) return;
    add(e->peer->syncs, 1);
    add(e->peer->wait_reply_ns, now_ns() - t0), add(e->peer->wait_reply_calls, 1);
}

ggml_backend_t w_rpc_init(ggml_backend_dev_t dev, const char * params) {
    ggml_backend_t b = o_rpc_init_backend(dev, params);
    if (b == nullptr) return b;
    std::lock_guard<std::mutex> lock(g_install_mutex);
    if (!o_rpc_backend_set) {
        o_rpc_backend = b->iface;
        o_rpc_backend_set = true;
    }
    b->iface.set_tensor_async = w_set_async;
    b->iface.get_tensor_async = w_get_async;
    b->iface.synchronize = w_sync;
    b->iface.graph_compute = w_graph;
    return b;
}

// --- local backends
enum ggml_status w_local_graph(ggml_backend_t b, ggml_cgraph * g) {
    const local_orig * o = local_orig_of(b->device);
    const dev_entry * e = entry_of(b->device);
    const uint64_t t0 = now_ns();
    enum ggml_status s = o->graph_compute(b, g);
    // A session this process serves for a peer runs on its own thread: that compute is not the head's.
    if (e != nullptr && e->local != nullptr && !t_rpc_serving) {
        add(e->local->compute_ns, now_ns() - t0), add(e->local->computes, 1);
    }
    return s;
}
void w_local_sync(ggml_backend_t b) {
    const local_orig * o = local_orig_of(b->device);
    const dev_entry * e = entry_of(b->device);
    const uint64_t t0 = now_ns();
    o->synchronize(b);
    if (e != nullptr && e->local != nullptr && !t_rpc_serving) {
        add(e->local->sync_ns, now_ns() - t0), add(e->local->syncs, 1);
    }
}
ggml_backend_t w_local_init(ggml_backend_dev_t dev, const char * params) {
    const local_orig * o = local_orig_of(dev);
    ggml_backend_t b = o->init_backend(dev, params);
    if (b == nullptr) return b;
    std::lock_guard<std::mutex> lock(g_install_mutex);
    // Each local registry has one backend table; the first backend of a device gives the originals.
    local_orig * w = const_cast<local_orig *>(o);
    if (w->graph_compute == nullptr) {
        w->graph_compute = b->iface.graph_compute;
        w->synchronize = b->iface.synchronize;
    }
    if (b->iface.graph_compute == w->graph_compute && w->graph_compute != nullptr) b->iface.graph_compute = w_local_graph;
    if (b->iface.synchronize != nullptr && b->iface.synchronize == w->synchronize) b->iface.synchronize = w_local_sync;
    return b;
}

bool is_rpc(ggml_backend_dev_t dev) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    return reg != nullptr && strcmp(ggml_backend_reg_name(reg), "RPC") == 0;
}

// Wraps every device registered so far (idempotent); returns how many were newly wrapped.
int install_all() {
    std::lock_guard<std::mutex> lock(g_install_mutex);
    int added = 0;
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (entry_of(dev) != nullptr) continue;
        const int n = g_n_devs.load(std::memory_order_relaxed);
        if (n >= k_max) break;
        dev_entry e{dev, nullptr, nullptr, 0};
        if (is_rpc(dev)) {
            // An RPC device's description is its endpoint; its name is RPC<n> across all peers,
            // its index on the server is its place among the devices of the same endpoint.
            std::string endpoint = ggml_backend_dev_description(dev);
            peer_stats * p = nullptr;
            for (peer_stats * q : g_peers) {
                if (q->endpoint == endpoint) p = q;
            }
            uint32_t index = 0;
            for (int j = 0; j < n; j++) {
                if (g_devs[j].peer != nullptr && g_devs[j].peer->endpoint == endpoint) index++;
            }
            if (p == nullptr) {
                p = new peer_stats();
                p->endpoint = endpoint;
                size_t colon = endpoint.rfind(':');
                if (colon != std::string::npos) {
                    std::string host = endpoint.substr(0, colon);
                    p->port = (uint16_t) atoi(endpoint.c_str() + colon + 1);
                    // Upstream connects with gethostbyname (IPv4): the same resolution here.
                    addrinfo hints{}, * res = nullptr;
                    hints.ai_family = AF_INET;
                    hints.ai_socktype = SOCK_STREAM;
                    if (getaddrinfo(host.c_str(), nullptr, &hints, &res) == 0 && res != nullptr) {
                        p->addr = ((sockaddr_in *) res->ai_addr)->sin_addr;
                        p->resolved = true;
                        freeaddrinfo(res);
                    }
                }
                g_peers.push_back(p);
            }
            e.peer = p;
            e.remote_index = index;
            if (o_rpc_init_backend == nullptr) {
                o_rpc_init_backend = dev->iface.init_backend;
                o_rpc_event_sync = dev->iface.event_synchronize;
            }
            ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
            if (buft != nullptr) {
                if (o_rpc_alloc == nullptr) o_rpc_alloc = buft->iface.alloc_buffer;
                if (buft->iface.alloc_buffer == o_rpc_alloc) buft->iface.alloc_buffer = w_alloc;
            }
            g_devs[n] = e;
            g_n_devs.store(n + 1, std::memory_order_release);
            if (dev->iface.init_backend == o_rpc_init_backend) dev->iface.init_backend = w_rpc_init;
            if (dev->iface.event_synchronize == o_rpc_event_sync && o_rpc_event_sync != nullptr) {
                dev->iface.event_synchronize = w_event_sync;
            }
        } else {
            const int m = g_n_local_orig.load(std::memory_order_relaxed);
            if (m >= k_max || dev->iface.init_backend == nullptr) continue;
            local_stats * l = new local_stats();
            l->device = ggml_backend_dev_name(dev);
            g_locals.push_back(l);
            e.local = l;
            g_local_orig[m] = local_orig{dev, dev->iface.init_backend, nullptr, nullptr};
            g_n_local_orig.store(m + 1, std::memory_order_release);
            g_devs[n] = e;
            g_n_devs.store(n + 1, std::memory_order_release);
            dev->iface.init_backend = w_local_init;
        }
        added++;
    }
    return added;
}

// The dispatcher's socket of a peer, or -1. Cached by inode: a dispatcher that was freed (its
// last buffer and backend gone) and reconnected has a new socket, possibly on the same fd number.
int peer_socket(peer_stats * p) {
    std::lock_guard<std::mutex> lock(p->sock_mutex);
    if (p->sock_fd >= 0) {
        struct stat st{};
        if (fstat(p->sock_fd, &st) == 0 && st.st_ino == p->sock_ino) return p->sock_fd;
        p->sock_fd = -1;
    }
    const uint64_t now = now_ns();
    if (!p->resolved || now - p->sock_scanned_ns < 250000000ull) return -1;  // scan at most 4 times a second
    p->sock_scanned_ns = now;
    DIR * d = opendir("/proc/self/fd");
    if (d == nullptr) return -1;
    int best = -1;
    ino_t best_ino = 0;
    uint64_t best_bytes = 0;
    while (dirent * de = readdir(d)) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
        int fd = atoi(de->d_name);
        if (fd == dirfd(d)) continue;
        struct stat st{};
        if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || (fl & O_NONBLOCK)) continue;  // Node's sockets (the engine's probes) are non-blocking
        sockaddr_in peer{};
        socklen_t len = sizeof(peer);
        if (getpeername(fd, (sockaddr *) &peer, &len) != 0 || peer.sin_family != AF_INET) continue;
        if (peer.sin_port != htons(p->port) || peer.sin_addr.s_addr != p->addr.s_addr) continue;
        tcp_info ti{};
        socklen_t tl = sizeof(ti);
        if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0) continue;
        // The dispatcher's connection has carried the most (HELLO, DEVICE_COUNT, alignment, ...).
        uint64_t bytes = ti.tcpi_bytes_received + ti.tcpi_bytes_acked;
        if (best < 0 || bytes > best_bytes) {
            best = fd, best_ino = st.st_ino, best_bytes = bytes;
        }
    }
    closedir(d);
    p->sock_fd = best;
    p->sock_ino = best_ino;
    return best;
}

Napi::Value accounting_install(const Napi::CallbackInfo & info) {
    return Napi::Number::New(info.Env(), install_all());
}

inline Napi::Number big(Napi::Env env, uint64_t v) { return Napi::Number::New(env, (double) v); }
inline Napi::Number ms(Napi::Env env, uint64_t ns) { return Napi::Number::New(env, (double) ns / 1e6); }

// rpcAccounting() -> {peers: [...], local: [...]}: cumulative figures since install.
Napi::Value accounting_read(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    std::vector<peer_stats *> peers;
    std::vector<local_stats *> locals;
    {
        std::lock_guard<std::mutex> lock(g_install_mutex);
        peers = g_peers;
        locals = g_locals;
    }
    Napi::Object out = Napi::Object::New(env);
    Napi::Array pa = Napi::Array::New(env, peers.size());
    for (size_t i = 0; i < peers.size(); i++) {
        peer_stats * p = peers[i];
        Napi::Object o = Napi::Object::New(env);
        o.Set("endpoint", p->endpoint);
        Napi::Object cmds = Napi::Object::New(env);
        Napi::Object bytes = Napi::Object::New(env);
        uint64_t replied = 0;
        for (int k = 0; k < K_COUNT; k++) {
            const uint64_t n = p->cmds[k].load(std::memory_order_relaxed);
            cmds.Set(k_cmd_names[k], big(env, n));
            bytes.Set(k_cmd_names[k], big(env, p->cmd_bytes[k].load(std::memory_order_relaxed)));
            if (k_cmd_replied[k]) replied += n;
        }
        o.Set("commands", cmds);
        o.Set("commandBytes", bytes);
        o.Set("roundTrips", big(env, replied));
        o.Set("syncs", big(env, p->syncs.load()));
        o.Set("graphNodes", big(env, p->graph_nodes.load()));
        o.Set("waitReplyMs", ms(env, p->wait_reply_ns.load()));
        o.Set("waitReplyCalls", big(env, p->wait_reply_calls.load()));
        o.Set("waitSendMs", ms(env, p->wait_send_ns.load()));
        o.Set("waitSendCalls", big(env, p->wait_send_calls.load()));
        o.Set("serializeMs", ms(env, p->serialize_ns.load()));
        o.Set("enqueueMs", ms(env, p->enqueue_ns.load()));
        const int fd = peer_socket(p);
        tcp_info ti{};
        socklen_t tl = sizeof(ti);
        if (fd >= 0 && getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0) {
            Napi::Object t = Napi::Object::New(env);
            t.Set("fd", fd);
            t.Set("bytesSent", big(env, ti.tcpi_bytes_sent));
            t.Set("bytesAcked", big(env, ti.tcpi_bytes_acked));
            t.Set("bytesReceived", big(env, ti.tcpi_bytes_received));
            t.Set("segsOut", big(env, ti.tcpi_segs_out));
            t.Set("segsIn", big(env, ti.tcpi_segs_in));
            t.Set("dataSegsOut", big(env, ti.tcpi_data_segs_out));
            t.Set("dataSegsIn", big(env, ti.tcpi_data_segs_in));
            t.Set("rttUs", big(env, ti.tcpi_rtt));
            t.Set("rttVarUs", big(env, ti.tcpi_rttvar));
            t.Set("minRttUs", big(env, ti.tcpi_min_rtt));
            t.Set("retransmits", big(env, ti.tcpi_total_retrans));
            o.Set("tcp", t);
        } else {
            o.Set("tcp", env.Null());
        }
        pa.Set((uint32_t) i, o);
    }
    out.Set("peers", pa);
    Napi::Array la = Napi::Array::New(env, locals.size());
    for (size_t i = 0; i < locals.size(); i++) {
        local_stats * l = locals[i];
        Napi::Object o = Napi::Object::New(env);
        o.Set("device", l->device);
        o.Set("computes", big(env, l->computes.load()));
        o.Set("computeMs", ms(env, l->compute_ns.load()));
        o.Set("syncs", big(env, l->syncs.load()));
        o.Set("syncMs", ms(env, l->sync_ns.load()));
        la.Set((uint32_t) i, o);
    }
    out.Set("local", la);
    return out;
}

}  // namespace

void hydra_rpc_stats_init(Napi::Env env, Napi::Object exports) {
    exports.Set("rpcAccountingInstall", Napi::Function::New(env, accounting_install));
    exports.Set("rpcAccounting", Napi::Function::New(env, accounting_read));
}
