// A validating relay in front of upstream's ggml-RPC server: every client message is parsed with the
// pinned wire format and checked against this session's own buffers before upstream sees it.
#pragma once

#include "ggml-backend.h"

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

// Per-session caps; 0 in max_alloc_bytes means "derive from the served devices" (see guard.cpp).
struct hydra_rpc_limits {
    uint64_t max_alloc_bytes = 0;
    uint64_t max_message_bytes = 64ull << 20;
    uint32_t max_graph_nodes = 32768;
    uint32_t max_graph_tensors = 131072;
    uint32_t max_graph_depth = 16384;
    uint32_t max_buffers = 1024;
    int hello_timeout_ms = 10000;
    int stall_timeout_ms = 30000;
    int idle_timeout_ms = 60000;
};

struct hydra_rpc_guard_outcome {
    // how the session ended: "client" (it left), "refused", "timeout", "server" (upstream ended it)
    std::string ended = "client";
    std::string reason;   // why, for "refused" and "timeout"
    std::string command;  // the refused command's name
    uint64_t refusals = 0;       // messages refused (the session-ending one included)
    uint64_t alloc_denied = 0;   // ALLOC_BUFFER answered as failed because of max_alloc_bytes/max_buffers
    uint64_t messages = 0;       // client messages relayed
    uint64_t alloc_bytes_peak = 0;
};

// What the SET_TENSOR_HASH in flight may write: the guard sets it before forwarding the request,
// upstream's resolver (hydra_rpc_guarded_resolve, on upstream's thread) reads it.
struct hydra_rpc_hash_bound {
    std::mutex mutex;
    uint64_t max_size = 0;
};

// The weights-index resolver for a guarded session (user_data: its hydra_rpc_hash_bound): a hit
// larger than the tensor region of the request in flight is answered as a miss.
const void * hydra_rpc_guarded_resolve(void * bound, uint64_t hash, size_t * size);

// The default session allocation cap for these devices (the rule is in guard.cpp).
uint64_t hydra_rpc_default_alloc_cap(const std::vector<ggml_backend_t> & backends);

// Relays one session from client_fd (the client's connection, left open) to server_fd (upstream's
// end of a socketpair, left open), validating every message; returns when either side ends.
// GET_TENSOR is answered by this thread itself while upstream is idle (n_cmds, upstream's command
// counter, then counts it).
void hydra_rpc_guard_run(int client_fd, int server_fd, const std::vector<ggml_backend_t> & backends,
                         const hydra_rpc_limits & limits, const char * cache_dir, hydra_rpc_hash_bound * bound,
                         uint64_t * n_cmds, hydra_rpc_guard_outcome & out);
