// The validating ggml-RPC relay (see hydra_rpc_guard.h). The checks mirror upstream's rpc_server
// (packages/native-ggml/upstream/ggml/src/ggml-rpc/ggml-rpc.cpp) and the asserts of the ops it
// computes: whatever upstream or a compute thread would assert on, crash on, or write out of bounds
// for is refused here, before upstream reads the message. Data-dependent faults (row ids inside
// GET_ROWS/SET_ROWS/MUL_MAT_ID index tensors) cannot be seen on the wire; containment covers those.
#include "hydra_rpc_guard.h"

#include "ggml.h"

#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include <errno.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace {

#pragma pack(push, 1)
// The pinned wire structs (ggml-rpc.cpp, protocol 6.x): copied, not included, as upstream keeps them
// file-local; the static_asserts below pin the sizes the tests also encode.
struct rpc_tensor {
    uint64_t id;
    uint32_t type;
    uint64_t buffer;
    uint32_t ne[GGML_MAX_DIMS];
    uint32_t nb[GGML_MAX_DIMS];
    uint32_t op;
    int32_t op_params[GGML_MAX_OP_PARAMS / sizeof(int32_t)];
    int32_t flags;
    uint64_t src[GGML_MAX_SRC];
    uint64_t view_src;
    uint64_t view_offs;
    uint64_t data;
    char name[GGML_MAX_NAME];
    int32_t use_count;
};
struct alloc_buffer_req { uint32_t device; uint64_t size; };
struct alloc_buffer_rsp { uint64_t remote_ptr; uint64_t remote_size; };
struct buffer_clear_req { uint64_t remote_ptr; uint8_t value; };
struct memset_tensor_req { rpc_tensor tensor; uint64_t offset; uint64_t size; uint8_t value; };
struct set_tensor_hash_req { rpc_tensor tensor; uint64_t offset; uint64_t hash; };
struct get_tensor_req { rpc_tensor tensor; uint64_t offset; uint64_t size; };
struct copy_tensor_req { rpc_tensor src; rpc_tensor dst; };
struct get_alloc_size_req { uint32_t device; rpc_tensor tensor; rpc_tensor srcs[GGML_MAX_SRC]; };
#pragma pack(pop)
static_assert(sizeof(rpc_tensor) == 296, "rpc_tensor of the pinned protocol");
static_assert(sizeof(get_alloc_size_req) == 3260, "GET_ALLOC_SIZE of the pinned protocol");

enum : uint8_t {
    CMD_ALLOC_BUFFER = 0, CMD_GET_ALIGNMENT, CMD_GET_MAX_SIZE, CMD_BUFFER_GET_BASE, CMD_FREE_BUFFER,
    CMD_BUFFER_CLEAR, CMD_SET_TENSOR, CMD_SET_TENSOR_HASH, CMD_GET_TENSOR, CMD_COPY_TENSOR,
    CMD_GRAPH_COMPUTE, CMD_GET_DEVICE_MEMORY, CMD_INIT_TENSOR, CMD_GET_ALLOC_SIZE, CMD_HELLO,
    CMD_DEVICE_COUNT, CMD_GRAPH_RECOMPUTE, CMD_MEMSET_TENSOR, CMD_COUNT_KNOWN,
};
constexpr size_t HELLO_REQ = 24, HELLO_RSP = 28;
constexpr size_t SET_TENSOR_HEAD = sizeof(rpc_tensor) + sizeof(uint64_t);
constexpr size_t READ_BUF = 1 << 20;

const char * cmd_name(uint8_t c) {
    static const char * names[] = {"ALLOC_BUFFER", "GET_ALIGNMENT", "GET_MAX_SIZE", "BUFFER_GET_BASE",
                                   "FREE_BUFFER", "BUFFER_CLEAR", "SET_TENSOR", "SET_TENSOR_HASH",
                                   "GET_TENSOR", "COPY_TENSOR", "GRAPH_COMPUTE", "GET_DEVICE_MEMORY",
                                   "INIT_TENSOR", "GET_ALLOC_SIZE", "HELLO", "DEVICE_COUNT",
                                   "GRAPH_RECOMPUTE", "MEMSET_TENSOR"};
    return c < CMD_COUNT_KNOWN ? names[c] : "UNKNOWN";
}

using u128 = unsigned __int128;

struct buf_info {
    uint64_t ptr;
    uint64_t base;
    uint64_t size;
    uint32_t device;
    uint32_t mark;  // graph epoch that last referenced it
};

struct refuse {
    std::string why;
};

std::string fmt(const char * f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char * f, ...) {
    char b[256];
    va_list ap;
    va_start(ap, f);
    vsnprintf(b, sizeof(b), f, ap);
    va_end(ap);
    return b;
}

bool is_f(ggml_type t) { return t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16; }
bool rows_ok(const ggml_tensor * t) { return t->nb[0] == ggml_type_size(t->type); }
bool all_f32(const ggml_tensor * a, const ggml_tensor * b, const ggml_tensor * c) {
    return a->type == GGML_TYPE_F32 && b->type == GGML_TYPE_F32 && c->type == GGML_TYPE_F32;
}

// Shapes and types valid for the op, from the op's own constructor asserts (ggml.c) and the CPU
// kernels' asserts and type switches (ggml-cpu/ops.cpp, binary-ops.cpp, unary-ops.cpp). An op not
// listed is refused: that excludes every op that carries a host address in op_params
// (MAP_CUSTOM1..3, CUSTOM) and the training ops.
const char * op_check(const ggml_tensor * t) {
    const ggml_tensor * s0 = t->src[0];
    const ggml_tensor * s1 = t->src[1];
    const ggml_tensor * s2 = t->src[2];
#define REQ(c, why) \
    if (!(c)) return why
    switch (t->op) {
        case GGML_OP_NONE:
            return nullptr;
        case GGML_OP_VIEW:
        case GGML_OP_RESHAPE:
        case GGML_OP_PERMUTE:
        case GGML_OP_TRANSPOSE:
            // no compute: data and bounds were checked with the tensor
            REQ(s0 != nullptr, "view without a source");
            return nullptr;
        default:
            break;
    }
    REQ(rows_ok(t), "result rows are not contiguous");
    switch (t->op) {
        case GGML_OP_ADD:
        case GGML_OP_SUB:
        case GGML_OP_MUL:
        case GGML_OP_DIV: {
            REQ(s0 && s1, "binary op without two sources");
            REQ(ggml_can_repeat(s1, s0), "binary op: src1 cannot repeat to src0");
            REQ(ggml_are_same_shape(s0, t), "binary op: result shape differs from src0");
            // src1 may be strided in every dim (binary-ops.cpp vec_binary_op_non_contiguous)
            REQ(rows_ok(s0), "binary op: src0 rows are not contiguous");
            const ggml_type a = s0->type, b = s1->type, d = t->type;
            bool ok = (a == GGML_TYPE_F32 && b == GGML_TYPE_F32 && d == GGML_TYPE_F32) ||
                      (a == GGML_TYPE_F16 && b == GGML_TYPE_F16 && d == GGML_TYPE_F16) ||
                      (a == GGML_TYPE_BF16 && b == GGML_TYPE_BF16 && d == GGML_TYPE_BF16) ||
                      ((a == GGML_TYPE_F16 || a == GGML_TYPE_BF16) && b == GGML_TYPE_F32 && (d == a || d == GGML_TYPE_F32));
            REQ(ok, "binary op: unsupported types");
            return nullptr;
        }
        case GGML_OP_ADD_ID:
            // src2 holds row ids into src1 (data: the CPU kernel asserts their range)
            REQ(s0 && s1 && s2 && s2->type == GGML_TYPE_I32, "ADD_ID: needs I32 row ids");
            REQ(s0->type == GGML_TYPE_F32 && s1->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32, "ADD_ID: F32 only");
            REQ(s0->ne[0] == s1->ne[0] && s0->ne[1] == s2->ne[0] && s0->ne[2] == s2->ne[1] && ggml_are_same_shape(s0, t), "ADD_ID: shapes");
            REQ(rows_ok(s0) && rows_ok(s1) && rows_ok(s2), "ADD_ID: rows not contiguous");
            return nullptr;
        case GGML_OP_SQR:
        case GGML_OP_SQRT:
        case GGML_OP_LOG:
        case GGML_OP_SCALE:
        case GGML_OP_CLAMP:
        case GGML_OP_UNARY:
        case GGML_OP_DIAG_MASK_INF: {
            REQ(s0, "op without a source");
            if (t->op == GGML_OP_UNARY) {
                REQ(t->op_params[0] >= 0 && t->op_params[0] < GGML_UNARY_OP_COUNT, "unknown unary op");
            }
            REQ(ggml_are_same_shape(s0, t) && s0->type == t->type, "result differs from its source");
            REQ(t->type == GGML_TYPE_F32 || (t->type == GGML_TYPE_F16 && t->op != GGML_OP_SCALE && t->op != GGML_OP_DIAG_MASK_INF && t->op != GGML_OP_CLAMP),
                "unsupported type");
            REQ(ggml_is_contiguous_1(s0) && ggml_is_contiguous_1(t) && rows_ok(s0), "source not contiguous");
            if (t->op == GGML_OP_SCALE || t->op == GGML_OP_DIAG_MASK_INF) {
                // their CPU kernels assert whole-tensor contiguity (ops.cpp scale_f32, diag_mask_f32)
                REQ(ggml_is_contiguous(s0) && ggml_is_contiguous(t), "not contiguous");
            }
            if (t->op == GGML_OP_DIAG_MASK_INF) {
                REQ(t->op_params[0] >= 0, "DIAG_MASK_INF: n_past");
            }
            return nullptr;
        }
        case GGML_OP_GLU: {
            REQ(s0, "GLU without a source");
            REQ(t->op_params[0] >= 0 && t->op_params[0] < GGML_GLU_OP_COUNT, "unknown GLU op");
            REQ(is_f(s0->type) && s0->type != GGML_TYPE_BF16 && t->type == s0->type, "GLU: unsupported types");
            REQ(ggml_is_contiguous_1(s0) && rows_ok(s0) && ggml_is_contiguous_1(t), "GLU: not contiguous");
            if (s1) {
                REQ(ggml_are_same_shape(s0, s1) && s1->type == s0->type && rows_ok(s1) && ggml_is_contiguous_1(s1), "GLU: halves differ");
                REQ(ggml_are_same_shape(s0, t), "GLU: result shape");
            } else {
                REQ(s0->ne[0] == 2 * t->ne[0] && s0->ne[1] == t->ne[1] && s0->ne[2] == t->ne[2] && s0->ne[3] == t->ne[3], "GLU: result shape");
            }
            return nullptr;
        }
        case GGML_OP_RMS_NORM:
        case GGML_OP_NORM:
        case GGML_OP_L2_NORM:
            REQ(s0 && s0->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32, "norm: F32 only");
            REQ(ggml_are_same_shape(s0, t) && rows_ok(s0), "norm: shape");
            {
                float eps;
                memcpy(&eps, &t->op_params[0], sizeof(eps));
                REQ(eps >= 0.0f, "norm: eps");  // the kernels assert it (a NaN fails too)
            }
            return nullptr;
        case GGML_OP_MUL_MAT: {
            REQ(s0 && s1, "MUL_MAT without two sources");
            REQ(s0->ne[0] == s1->ne[0] && s1->ne[2] % s0->ne[2] == 0 && s1->ne[3] % s0->ne[3] == 0, "MUL_MAT: cannot multiply");
            REQ(!ggml_is_transposed(s0), "MUL_MAT: transposed src0");
            REQ(t->ne[0] == s0->ne[1] && t->ne[1] == s1->ne[1] && t->ne[2] == s1->ne[2] && t->ne[3] == s1->ne[3], "MUL_MAT: result shape");
            REQ(t->type == GGML_TYPE_F32 && s1->type == GGML_TYPE_F32, "MUL_MAT: F32 result and src1 only");
            REQ(is_f(s0->type) || (ggml_is_quantized(s0->type) && ggml_get_type_traits(s0->type)->to_float), "MUL_MAT: unsupported src0 type");
            REQ(rows_ok(s0) && rows_ok(s1), "MUL_MAT: rows not contiguous");
            REQ(t->nb[0] <= t->nb[1] && t->nb[1] <= t->nb[2] && t->nb[2] <= t->nb[3], "MUL_MAT: result strides");
            return nullptr;
        }
        case GGML_OP_MUL_MAT_ID: {
            REQ(s0 && s1 && s2, "MUL_MAT_ID needs three sources");
            REQ(!ggml_is_transposed(s0) && s2->type == GGML_TYPE_I32, "MUL_MAT_ID: ids type");
            REQ(s0->ne[3] == 1 && s1->ne[3] == 1 && s2->ne[2] == 1 && s2->ne[3] == 1, "MUL_MAT_ID: ranks");
            REQ(s2->ne[1] == s1->ne[2] && s0->ne[0] == s1->ne[0] && s1->ne[1] != 0 && s2->ne[0] % s1->ne[1] == 0, "MUL_MAT_ID: shapes");
            REQ(t->ne[0] == s0->ne[1] && t->ne[1] == s2->ne[0] && t->ne[2] == s1->ne[2] && t->ne[3] == 1, "MUL_MAT_ID: result shape");
            REQ(t->type == GGML_TYPE_F32 && s1->type == GGML_TYPE_F32, "MUL_MAT_ID: F32 result and src1 only");
            REQ(is_f(s0->type) || (ggml_is_quantized(s0->type) && ggml_get_type_traits(s0->type)->to_float), "MUL_MAT_ID: unsupported src0 type");
            REQ(rows_ok(s0) && rows_ok(s1) && rows_ok(s2), "MUL_MAT_ID: rows not contiguous");
            return nullptr;
        }
        case GGML_OP_GET_ROWS:
            REQ(s0 && s1 && s1->type == GGML_TYPE_I32, "GET_ROWS: needs I32 row ids");
            REQ(s0->ne[2] == s1->ne[1] && s0->ne[3] == s1->ne[2] && s1->ne[3] == 1, "GET_ROWS: shapes");
            REQ(t->ne[0] == s0->ne[0] && t->ne[1] == s1->ne[0] && t->ne[2] == s1->ne[1] && t->ne[3] == s1->ne[2], "GET_ROWS: result shape");
            REQ(is_f(s0->type) || s0->type == GGML_TYPE_I32 || (ggml_is_quantized(s0->type) && ggml_get_type_traits(s0->type)->to_float),
                "GET_ROWS: unsupported source type");
            REQ(t->type == GGML_TYPE_F32 || t->type == s0->type, "GET_ROWS: result type");
            REQ(rows_ok(s0) && rows_ok(s1), "GET_ROWS: rows not contiguous");
            return nullptr;
        case GGML_OP_SET_ROWS: {
            // src0: rows, src1: row ids, src2 (when present): the destination the result views
            REQ(s0 && s1, "SET_ROWS: needs rows and row ids");
            REQ(t->ne[0] == s0->ne[0] && t->ne[2] == s0->ne[2] && t->ne[3] == s0->ne[3], "SET_ROWS: destination shape");
            REQ(s0->ne[1] == s1->ne[0] && s1->ne[1] != 0 && s1->ne[2] != 0 && s0->ne[2] % s1->ne[1] == 0 && s0->ne[3] % s1->ne[2] == 0 && s1->ne[3] == 1,
                "SET_ROWS: row ids shape");
            REQ(s0->type == GGML_TYPE_F32 || s0->type == GGML_TYPE_F16, "SET_ROWS: rows type");
            REQ(s1->type == GGML_TYPE_I64 || s1->type == GGML_TYPE_I32, "SET_ROWS: row ids type");
            REQ(ggml_is_contiguous_rows(t) && ggml_is_contiguous_rows(s0) && rows_ok(s1), "SET_ROWS: rows not contiguous");
            REQ(ggml_get_type_traits(t->type)->from_float_ref != nullptr || is_f(t->type), "SET_ROWS: destination type");
            if (s2) {
                REQ(ggml_are_same_shape(s2, t) && s2->type == t->type && s2->data == t->data, "SET_ROWS: result is not its destination");
            }
            return nullptr;
        }
        case GGML_OP_CPY:
        case GGML_OP_DUP:
        case GGML_OP_CONT: {
            REQ(s0, "copy without a source");
            REQ(ggml_nelements(s0) == ggml_nelements(t), "copy: element counts differ");
            const ggml_type a = s0->type, d = t->type;
            bool ok = a == d ? (ggml_blck_size(a) == 1 || (ggml_is_contiguous(s0) && ggml_is_contiguous(t)))
                             : ((is_f(a) && (is_f(d) || d == GGML_TYPE_I32 || ggml_get_type_traits(d)->from_float_ref != nullptr)) ||
                                (ggml_is_quantized(a) && ggml_get_type_traits(a)->to_float && d == GGML_TYPE_F32) ||
                                (a == GGML_TYPE_I32 && d == GGML_TYPE_F32));
            REQ(ok, "copy: unsupported types");
            if (ggml_blck_size(a) > 1 || ggml_blck_size(d) > 1) {
                REQ(s0->ne[0] == t->ne[0] && rows_ok(s0), "copy: quantized rows differ");
            }
            return nullptr;
        }
        case GGML_OP_SOFT_MAX:
            REQ(s0 && s0->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32 && ggml_are_same_shape(s0, t), "SOFT_MAX: shape/type");
            REQ(ggml_is_contiguous(s0) && ggml_is_contiguous(t), "SOFT_MAX: not contiguous");
            if (s1) {
                REQ((s1->type == GGML_TYPE_F16 || s1->type == GGML_TYPE_F32) && ggml_is_contiguous(s1), "SOFT_MAX: mask type");
                REQ(s1->ne[0] == s0->ne[0] && s1->ne[1] >= s0->ne[1] && s1->ne[2] != 0 && s1->ne[3] != 0 &&
                        s0->ne[2] % s1->ne[2] == 0 && s0->ne[3] % s1->ne[3] == 0,
                    "SOFT_MAX: mask shape");
            }
            if (s2) {
                REQ(s2->type == GGML_TYPE_F32 && s2->ne[0] == s0->ne[2], "SOFT_MAX: sinks");
            }
            return nullptr;
        case GGML_OP_ROPE: {
            REQ(s0 && s1 && (s0->type == GGML_TYPE_F32 || s0->type == GGML_TYPE_F16) && t->type == s0->type, "ROPE: types");
            REQ(s1->type == GGML_TYPE_I32 && ggml_is_vector(s1), "ROPE: positions");
            const int mode = t->op_params[2];
            const int n_dims = t->op_params[1];
            REQ((mode & 1) == 0, "ROPE: mode");
            REQ((mode & GGML_ROPE_TYPE_MROPE) ? s0->ne[2] * 4 == s1->ne[0] : s0->ne[2] == s1->ne[0], "ROPE: positions count");
            REQ(n_dims > 0 && n_dims <= s0->ne[0] && n_dims % 2 == 0, "ROPE: n_dims");
            if (s2) {
                REQ(s2->type == GGML_TYPE_F32 && s2->ne[0] >= n_dims / 2, "ROPE: freq factors");
            }
            REQ(ggml_are_same_shape(s0, t) && rows_ok(s0) && s0->nb[0] == t->nb[0], "ROPE: shape");
            return nullptr;
        }
        case GGML_OP_FLASH_ATTN_EXT: {
            const ggml_tensor * q = s0, * k = s1, * v = s2, * mask = t->src[3], * sinks = t->src[4];
            REQ(q && k && v, "FLASH_ATTN_EXT: q, k, v");
            REQ(k->ne[0] == q->ne[0] && k->ne[2] != 0 && q->ne[2] % k->ne[2] == 0 && q->ne[3] == k->ne[3] && q->ne[3] == v->ne[3], "FLASH_ATTN_EXT: q/k shapes");
            REQ(v->ne[1] == k->ne[1] && v->ne[2] == k->ne[2], "FLASH_ATTN_EXT: k/v shapes");
            REQ(q->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32, "FLASH_ATTN_EXT: F32 q and result");
            REQ(k->type == v->type && (is_f(k->type) || (ggml_is_quantized(k->type) && ggml_get_type_traits(k->type)->to_float)), "FLASH_ATTN_EXT: k/v types");
            REQ(rows_ok(q) && rows_ok(k) && rows_ok(v), "FLASH_ATTN_EXT: rows not contiguous");
            if (mask) {
                REQ(mask->type == GGML_TYPE_F16 && ggml_is_contiguous(mask) && mask->ne[0] == k->ne[1] && mask->ne[1] >= q->ne[1] &&
                        mask->ne[2] != 0 && mask->ne[3] != 0 && q->ne[2] % mask->ne[2] == 0 && q->ne[3] % mask->ne[3] == 0,
                    "FLASH_ATTN_EXT: mask");
            }
            if (sinks) {
                REQ(sinks->type == GGML_TYPE_F32 && sinks->ne[0] == q->ne[2], "FLASH_ATTN_EXT: sinks");
            }
            REQ(t->ne[0] == v->ne[0] && t->ne[1] == q->ne[2] && t->ne[2] == q->ne[1] && t->ne[3] == q->ne[3], "FLASH_ATTN_EXT: result shape");
            return nullptr;
        }
        case GGML_OP_CONCAT: {
            REQ(s0 && s1 && s0->type == s1->type && t->type == s0->type, "CONCAT: types");
            const int dim = t->op_params[0];
            REQ(dim >= 0 && dim < GGML_MAX_DIMS, "CONCAT: dim");
            for (int d = 0; d < GGML_MAX_DIMS; d++) {
                if (d == dim) {
                    REQ(t->ne[d] == s0->ne[d] + s1->ne[d], "CONCAT: result shape");
                } else {
                    REQ(s0->ne[d] == s1->ne[d] && t->ne[d] == s0->ne[d], "CONCAT: shapes");
                }
            }
            REQ(ggml_blck_size(t->type) == 1, "CONCAT: quantized");
            return nullptr;
        }
        case GGML_OP_PAD: {
            REQ(s0 && s0->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32 && ggml_is_contiguous(t), "PAD: F32, contiguous result");
            REQ(t->op_params[8] == 0 || t->op_params[8] == 1, "PAD: circular flag");
            for (int d = 0; d < GGML_MAX_DIMS; d++) {
                const int64_t lp = t->op_params[2 * d], rp = t->op_params[2 * d + 1];
                REQ(lp >= 0 && rp >= 0 && t->ne[d] == s0->ne[d] + lp + rp, "PAD: padding");
                REQ(t->op_params[8] == 0 || s0->ne[d] > 0, "PAD: circular over an empty dim");
            }
            return nullptr;
        }
        case GGML_OP_ARGMAX:
            REQ(s0 && s0->type == GGML_TYPE_F32 && t->type == GGML_TYPE_I32 && rows_ok(s0), "ARGMAX: types");
            REQ(s0->ne[2] == 1 && s0->ne[3] == 1 && t->ne[0] == s0->ne[1] && t->ne[1] == 1 && t->ne[2] == 1 && t->ne[3] == 1, "ARGMAX: shape");
            return nullptr;
        case GGML_OP_SUM:
            REQ(s0 && is_f(s0->type) && t->type == s0->type && rows_ok(s0), "SUM: types");
            REQ(t->ne[0] == 1 && t->ne[1] == 1 && t->ne[2] == 1 && t->ne[3] == 1, "SUM: result is not a scalar");
            return nullptr;
        case GGML_OP_CUMSUM:
            REQ(s0 && s0->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32 && rows_ok(s0) && ggml_are_same_shape(s0, t), "CUMSUM: shape/type");
            return nullptr;
        case GGML_OP_FILL:
            REQ(s0 && (t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16) && ggml_is_contiguous(t) && ggml_are_same_shape(s0, t), "FILL: shape/type");
            return nullptr;
        case GGML_OP_REPEAT:
            REQ(s0 && ggml_can_repeat(s0, t) && s0->type == t->type && is_f(t->type) && rows_ok(s0), "REPEAT: shape/type");
            return nullptr;
        case GGML_OP_SUM_ROWS:
            REQ(s0 && s0->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32 && rows_ok(s0), "SUM_ROWS: type");
            REQ(t->ne[0] == 1 && t->ne[1] == s0->ne[1] && t->ne[2] == s0->ne[2] && t->ne[3] == s0->ne[3], "SUM_ROWS: shape");
            return nullptr;
        case GGML_OP_ARGSORT:
        case GGML_OP_TOP_K:
            REQ(s0 && s0->type == GGML_TYPE_F32 && t->type == GGML_TYPE_I32 && rows_ok(s0), "sort: types");
            REQ((t->op == GGML_OP_ARGSORT ? t->ne[0] == s0->ne[0] : t->ne[0] <= s0->ne[0]) && t->ne[1] == s0->ne[1] &&
                    t->ne[2] == s0->ne[2] && t->ne[3] == s0->ne[3],
                "sort: shape");
            return nullptr;
        // The recurrent ops of hybrid and linear-attention models: the rules are ggml.c's
        // constructors, plus what the CPU kernels index without asserting (ggml-cpu/ops.cpp).
        case GGML_OP_SSM_CONV: {
            REQ(s0 && s1 && all_f32(t, s0, s1), "SSM_CONV: F32 only");
            REQ(ggml_is_3d(s0) && ggml_is_matrix(s1), "SSM_CONV: ranks");
            const int64_t d_conv = s1->ne[0], d_inner = s1->ne[1], n_t = s0->ne[0] - d_conv + 1;
            REQ(n_t >= 0 && s0->ne[1] == d_inner, "SSM_CONV: shapes");
            REQ(t->ne[0] == d_inner && t->ne[1] == n_t && t->ne[2] == s0->ne[2] && t->ne[3] == 1, "SSM_CONV: result shape");
            REQ(rows_ok(s0) && s0->nb[1] == s0->ne[0] * sizeof(float) && ggml_is_contiguous(s1), "SSM_CONV: not contiguous");
            return nullptr;
        }
        case GGML_OP_SSM_SCAN: {
            // src6 holds state row ids (data: which rows of s a sequence starts from)
            const ggml_tensor * st = s0, * x = s1, * dt = s2, * A = t->src[3], * B = t->src[4], * C = t->src[5], * ids = t->src[6];
            REQ(st && x && dt && A && B && C && ids, "SSM_SCAN needs seven sources");
            REQ(all_f32(t, st, x) && all_f32(dt, A, B) && C->type == GGML_TYPE_F32 && ids->type == GGML_TYPE_I32, "SSM_SCAN: types");
            const int64_t K = t->op_params[0];
            REQ(K >= 1, "SSM_SCAN: K");
            REQ(ggml_is_contiguous(st) && ggml_is_contiguous(dt) && ggml_is_contiguous(A) && ggml_is_contiguous(t), "SSM_SCAN: not contiguous");
            REQ(rows_ok(x) && rows_ok(B) && rows_ok(C) && rows_ok(ids) && x->nb[1] == x->ne[0] * x->nb[0] && B->nb[1] == B->ne[0] * B->nb[0] &&
                    C->nb[1] == C->ne[0] * C->nb[0] && ggml_are_same_shape(B, C),
                "SSM_SCAN: B/C/x layout");
            const int64_t d_state = st->ne[0], head_dim = x->ne[0], n_head = x->ne[1], n_tok = x->ne[2], n_seqs = x->ne[3];
            REQ(dt->ne[0] == n_head && dt->ne[1] == n_tok && dt->ne[2] == n_seqs && ggml_is_3d(dt), "SSM_SCAN: dt shape");
            REQ(st->ne[1] == head_dim && st->ne[2] == n_head && B->ne[0] == d_state && B->ne[2] == n_tok && B->ne[3] == n_seqs, "SSM_SCAN: shapes");
            REQ(B->ne[1] != 0 && n_head % B->ne[1] == 0, "SSM_SCAN: groups");
            REQ(ids->ne[0] == n_seqs && ggml_is_vector(ids), "SSM_SCAN: ids shape");
            REQ(A->ne[1] == n_head && ggml_is_matrix(A) && (A->ne[0] == 1 || (A->ne[0] == d_state && K == 1)), "SSM_SCAN: A shape");
            REQ(ggml_nelements(t) == ggml_nelements(x) + K * d_state * head_dim * n_head * n_seqs, "SSM_SCAN: result size");
            return nullptr;
        }
        case GGML_OP_GATED_DELTA_NET: {
            const ggml_tensor * q = s0, * k = s1, * v = s2, * g = t->src[3], * beta = t->src[4], * st = t->src[5];
            REQ(q && k && v && g && beta && st, "GATED_DELTA_NET needs six sources");
            REQ(all_f32(t, q, k) && all_f32(v, g, beta) && st->type == GGML_TYPE_F32, "GATED_DELTA_NET: F32 only");
            REQ(ggml_is_contiguous_rows(q) && ggml_is_contiguous_rows(k) && ggml_is_contiguous_rows(v) && ggml_is_contiguous(g) &&
                    ggml_is_contiguous(beta) && ggml_is_contiguous(st) && ggml_is_contiguous(t),
                "GATED_DELTA_NET: not contiguous");
            const int64_t S = v->ne[0], H = v->ne[1], T = v->ne[2], NS = v->ne[3], K = t->op_params[0];
            REQ(K >= 1 && (g->ne[0] == 1 || g->ne[0] == S) && beta->ne[0] == 1, "GATED_DELTA_NET: gate");
            REQ(st->ne[0] == S && st->ne[1] == S && st->ne[2] == H && st->ne[3] == NS, "GATED_DELTA_NET: state shape");
            // the kernel reads S values of q and k per head (modulo their head counts) and token
            REQ(q->ne[0] == S && k->ne[0] == S && q->ne[1] != 0 && k->ne[1] != 0 && q->ne[2] == T && k->ne[2] == T && q->ne[3] != 0 &&
                    k->ne[3] != 0 && NS % q->ne[3] == 0 && NS % k->ne[3] == 0,
                "GATED_DELTA_NET: q/k shapes");
            REQ(g->ne[1] == H && g->ne[2] == T && g->ne[3] == NS && beta->ne[1] == H && beta->ne[2] == T && beta->ne[3] == NS, "GATED_DELTA_NET: g/beta shapes");
            REQ(t->ne[0] == S * H && t->ne[1] == T * NS + K * S * NS && t->ne[2] == 1 && t->ne[3] == 1, "GATED_DELTA_NET: result shape");
            return nullptr;
        }
        case GGML_OP_RWKV_WKV6:
        case GGML_OP_RWKV_WKV7:
        case GGML_OP_GATED_LINEAR_ATTN: {
            // sources: wkv6 k v r tf td state; wkv7 r w k v a b state; gla k v q g state
            const int n_src = t->op == GGML_OP_RWKV_WKV6 ? 6 : t->op == GGML_OP_RWKV_WKV7 ? 7 : 5;
            const ggml_tensor * st = t->src[n_src - 1];
            const ggml_tensor * k = t->op == GGML_OP_RWKV_WKV7 ? s2 : s0;
            for (int j = 0; j < n_src; j++) {
                REQ(t->src[j] && t->src[j]->type == GGML_TYPE_F32 && ggml_is_contiguous(t->src[j]), "linear attention: F32 contiguous sources");
            }
            REQ(t->type == GGML_TYPE_F32 && ggml_is_contiguous(t), "linear attention: F32 contiguous result");
            const int64_t S = k->ne[0], H = k->ne[1], T = k->ne[2], NS = st->ne[1];
            for (int j = 0; j < n_src - 1; j++) {
                const ggml_tensor * x = t->src[j];
                if (t->op == GGML_OP_RWKV_WKV6 && j == 3) {
                    REQ(ggml_nelements(x) >= S * H, "RWKV_WKV6: time_faaaa size");  // read as [S, H]
                    continue;
                }
                REQ(x->ne[0] == S && x->ne[1] == H && x->ne[2] == T && x->ne[3] == 1, "linear attention: shapes");
            }
            REQ(NS >= 1 && T % NS == 0 && ggml_nelements(st) == S * S * H * NS, "linear attention: state shape");
            REQ(t->ne[0] == S * H && t->ne[1] == T + S * NS && t->ne[2] == 1 && t->ne[3] == 1, "linear attention: result shape");
            return nullptr;
        }
        default:
            return "op not on the allowlist";
    }
#undef REQ
}

class guard {
public:
    guard(int cfd, int sfd, const std::vector<ggml_backend_t> & backends, const hydra_rpc_limits & limits,
          const char * cache_dir, hydra_rpc_hash_bound * bound, uint64_t * n_cmds, hydra_rpc_guard_outcome & out)
        : cfd(cfd), sfd(sfd), backends(backends), L(limits), cache_dir(cache_dir ? cache_dir : ""), bound(bound), n_cmds(n_cmds), out(out),
          rbuf(READ_BUF), stored(backends.size()) {
        alloc_cap = L.max_alloc_bytes ? L.max_alloc_bytes : hydra_rpc_default_alloc_cap(backends);
    }

    void run() {
        start = std::chrono::steady_clock::now();
        try {
            if (!hello()) {
                return;
            }
            while (one_message()) {
            }
        } catch (const refuse & r) {
            out.ended = "refused";
            out.reason = r.why;
            out.refusals++;
            fprintf(stderr, "hydra: refused a ggml-RPC %s and ended the session: %s\n", out.command.c_str(), r.why.c_str());
        }
    }

private:
    enum class wait { hello, idle, mid };

    // --- I/O -------------------------------------------------------------------------------------

    size_t avail() const { return rlen - rpos; }

    [[noreturn]] void timeout(const char * why) {
        out.ended = "timeout";
        out.reason = why;
        fprintf(stderr, "hydra: ended a ggml-RPC session: %s\n", why);
        throw stop{};
    }
    [[noreturn]] void gone(const char * who) {
        out.ended = who;
        throw stop{};
    }
    struct stop {};

    int timeout_ms(wait w) const {
        if (w == wait::hello) {
            auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
            return (int) std::max<int64_t>(0, L.hello_timeout_ms - spent);
        }
        if (w == wait::idle) {
            return buffers.empty() && L.idle_timeout_ms > 0 ? L.idle_timeout_ms : -1;
        }
        return L.stall_timeout_ms > 0 ? L.stall_timeout_ms : -1;
    }

    // Reads at least one more byte from the client into rbuf (compacting it first when full).
    void read_more(wait w) {
        if (rpos == rlen) {
            rpos = rlen = 0;
        } else if (rlen == rbuf.size()) {
            memmove(rbuf.data(), rbuf.data() + rpos, rlen - rpos);
            rlen -= rpos;
            rpos = 0;
        }
        while (true) {
            ssize_t n = recv(cfd, rbuf.data() + rlen, rbuf.size() - rlen, 0);
            if (n > 0) {
                rlen += (size_t) n;
                return;
            }
            if (n == 0) {
                gone("client");
            }
            if (errno == EINTR) {
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                gone("client");
            }
            pollfd p[2] = {{cfd, POLLIN, 0}, {sfd, POLLIN, 0}};
            int r = poll(p, 2, timeout_ms(w));
            if (r == 0) {
                timeout(w == wait::hello ? "no HELLO in time" : w == wait::idle ? "idle with no buffers" : "a message stopped arriving");
            }
            if (r < 0 && errno != EINTR) {
                gone("client");
            }
            if (p[1].revents) {
                gone("server");  // upstream never speaks unasked: it ended the session
            }
        }
    }

    void need(size_t n, wait w) {
        while (avail() < n) {
            read_more(avail() == 0 ? w : (w == wait::hello ? w : wait::mid));
            if (w == wait::idle) {
                w = wait::mid;
            }
        }
    }

    void send_server(const void * p, size_t n) {
        busy = true;
        const uint8_t * b = (const uint8_t *) p;
        while (n > 0) {
            ssize_t k = send(sfd, b, n, MSG_NOSIGNAL);
            if (k < 0 && errno == EINTR) {
                continue;
            }
            if (k <= 0) {
                gone("server");
            }
            b += k;
            n -= (size_t) k;
        }
    }

    void recv_server(void * p, size_t n) {
        uint8_t * b = (uint8_t *) p;
        while (n > 0) {
            ssize_t k = recv(sfd, b, n, 0);
            if (k < 0 && errno == EINTR) {
                continue;
            }
            if (k <= 0) {
                gone("server");
            }
            b += k;
            n -= (size_t) k;
        }
    }

    void send_client(const void * p, size_t n) {
        const uint8_t * b = (const uint8_t *) p;
        while (n > 0) {
            ssize_t k = send(cfd, b, n, MSG_NOSIGNAL);
            if (k > 0) {
                b += k;
                n -= (size_t) k;
                continue;
            }
            if (k < 0 && errno == EINTR) {
                continue;
            }
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                pollfd pc = {cfd, POLLOUT, 0};
                int r = poll(&pc, 1, L.stall_timeout_ms > 0 ? L.stall_timeout_ms : -1);
                if (r == 0) {
                    timeout("the client stopped reading");
                }
                continue;
            }
            gone("client");
        }
    }

    // Forwards n client bytes (already announced to upstream) in rbuf-sized chunks.
    void stream_client_to_server(uint64_t n) {
        while (n > 0) {
            if (avail() == 0) {
                read_more(wait::mid);
            }
            size_t m = (size_t) std::min<uint64_t>(n, avail());
            send_server(rbuf.data() + rpos, m);
            rpos += m;
            n -= m;
        }
    }

    // Relays upstream's reply of exactly `size` bytes; the first `keep_n` bytes are copied to keep.
    void relay_reply(uint64_t size, void * keep = nullptr, size_t keep_n = 0) {
        uint64_t got;
        recv_server(&got, sizeof(got));
        if (got != size) {
            fprintf(stderr, "hydra: upstream replied %" PRIu64 " bytes where %" PRIu64 " were due\n", got, size);
            gone("server");
        }
        uint8_t small[8 + 64];
        if (size <= 64) {
            memcpy(small, &got, 8);
            recv_server(small + 8, size);
            if (keep) {
                memcpy(keep, small + 8, std::min<size_t>(keep_n, size));
            }
            send_client(small, 8 + size);
            busy = false;
            return;
        }
        send_client(&got, 8);
        if (chunk.empty()) {
            chunk.resize(READ_BUF);
        }
        while (size > 0) {
            size_t m = (size_t) std::min<uint64_t>(size, chunk.size());
            recv_server(chunk.data(), m);
            send_client(chunk.data(), m);
            size -= m;
        }
        busy = false;
    }

    // GET_TENSOR answered here, as upstream's get_tensor would (| size u64 | data |), so the reply
    // (the logits of every decoded token) is not copied through the socketpair and back. Upstream
    // must be idle first: the reply of a barrier (GET_ALIGNMENT) arrives only once every command
    // relayed before it is done; while upstream waits for that next message, this thread reads.
    void serve_get_tensor(const ggml_tensor & t, uint64_t offset, uint64_t size) {
        if (busy) {
            uint8_t q[9 + 4] = {CMD_GET_ALIGNMENT};
            q[1] = 4;
            send_server(q, sizeof(q));
            uint8_t rsp[16];
            recv_server(rsp, sizeof(rsp));
            if (rsp[0] != 8) {
                gone("server");
            }
            busy = false;  // the barrier stands in for this command in upstream's count
        } else if (n_cmds != nullptr) {
            (*n_cmds)++;
        }
        if (chunk.empty()) {
            chunk.resize(READ_BUF);
        }
        memcpy(chunk.data(), &size, 8);
        size_t head = 8;
        do {
            size_t m = (size_t) std::min<uint64_t>(size, chunk.size() - head);
            if (m > 0) {
                ggml_backend_tensor_get(&t, chunk.data() + head, offset, m);
            }
            send_client(chunk.data(), head + m);
            offset += m;
            size -= m;
            head = 0;
        } while (size > 0);
    }

    // --- shadow of this session's buffers --------------------------------------------------------

    buf_info * find_buffer(uint64_t ptr) {
        if (last && last->ptr == ptr) {
            return last;
        }
        for (auto & b : buffers) {
            if (b.ptr == ptr) {
                return last = &b;
            }
        }
        return nullptr;
    }

    // Checks a wire tensor the way upstream deserializes it and fills t (with the real buffer
    // pointer) so ggml's own predicates can judge it.
    void tensor(const rpc_tensor & w, ggml_tensor & t, bool need_buffer, int device, buf_info ** where = nullptr) {
        if (w.type >= GGML_TYPE_COUNT || ggml_blck_size((ggml_type) w.type) == 0) {
            throw refuse{fmt("tensor %" PRIu64 ": invalid type %u", w.id, w.type)};
        }
        const ggml_type type = (ggml_type) w.type;
        const int64_t blck = ggml_blck_size(type);
        if (w.ne[0] % blck != 0) {
            throw refuse{fmt("tensor %" PRIu64 ": ne[0] %u is not a multiple of the block size", w.id, w.ne[0])};
        }
        if (w.op >= GGML_OP_COUNT) {
            throw refuse{fmt("tensor %" PRIu64 ": op %u past GGML_OP_COUNT", w.id, w.op)};
        }
        u128 nbytes128 = 0;
        bool empty = false;
        for (int i = 0; i < GGML_MAX_DIMS; i++) {
            empty |= w.ne[i] == 0;
        }
        if (!empty) {
            nbytes128 = blck == 1 ? (u128) ggml_type_size(type) : (u128) w.ne[0] * w.nb[0] / blck;
            for (int i = blck == 1 ? 0 : 1; i < GGML_MAX_DIMS; i++) {
                nbytes128 += (u128) (w.ne[i] - 1) * w.nb[i];
            }
        }
        nbytes = (uint64_t) std::min<u128>(nbytes128, UINT64_MAX);
        memset(&t, 0, sizeof(t));
        t.type = type;
        for (int i = 0; i < GGML_MAX_DIMS; i++) {
            t.ne[i] = w.ne[i];
            t.nb[i] = w.nb[i];
        }
        t.op = (ggml_op) w.op;
        memcpy(t.op_params, w.op_params, sizeof(t.op_params));
        t.flags = w.flags;
        t.data = (void *) w.data;
        t.view_offs = (size_t) w.view_offs;
        if (w.buffer == 0) {
            if (need_buffer) {
                throw refuse{fmt("tensor %" PRIu64 " (op %u, ne %u %u %u %u, data 0x%" PRIx64 "): no buffer", w.id, w.op, w.ne[0], w.ne[1], w.ne[2], w.ne[3], w.data)};
            }
            return;
        }
        buf_info * b = find_buffer(w.buffer);
        if (b == nullptr) {
            throw refuse{fmt("tensor %" PRIu64 ": buffer 0x%" PRIx64 " is not a live buffer of this session", w.id, w.buffer)};
        }
        if (device >= 0 && b->device != (uint32_t) device) {
            throw refuse{fmt("tensor %" PRIu64 ": buffer of device %u used on device %d", w.id, b->device, device)};
        }
        if (w.data < b->base || (u128) w.data + nbytes128 > (u128) b->base + b->size) {
            throw refuse{fmt("tensor %" PRIu64 ": data 0x%" PRIx64 " + %" PRIu64 " bytes outside its buffer", w.id, w.data, nbytes)};
        }
        t.buffer = (ggml_backend_buffer_t) (uintptr_t) w.buffer;
        if (where) {
            *where = b;
        }
    }

    // [data + offset, + size) inside the tensor's buffer, as upstream's own checks want it, and
    // inside the tensor (last checked by tensor()), as ggml_backend_tensor_set/get assert.
    void region(const rpc_tensor & w, uint64_t offset, uint64_t size, const char * what) {
        buf_info * b = find_buffer(w.buffer);
        u128 p = (u128) w.data + offset;
        if (b == nullptr || p < b->base || p >= (u128) b->base + b->size || p + size > (u128) b->base + b->size) {
            throw refuse{fmt("%s: offset %" PRIu64 " + %" PRIu64 " bytes outside the buffer", what, offset, size)};
        }
        if (size > 0 && (u128) offset + size > nbytes) {
            throw refuse{fmt("%s: offset %" PRIu64 " + %" PRIu64 " bytes outside the tensor", what, offset, size)};
        }
    }

    template <typename T>
    void payload(T & v) {
        memcpy(&v, rbuf.data() + rpos + 9, sizeof(T));
    }

    void device_arg(uint32_t device) {
        if (device >= backends.size()) {
            throw refuse{fmt("device %u of %zu", device, backends.size())};
        }
    }

    // --- the protocol ----------------------------------------------------------------------------

    bool hello() {
        out.command = "HELLO";
        need(9, wait::hello);
        uint64_t size;
        memcpy(&size, rbuf.data() + rpos + 1, 8);
        if (rbuf[rpos] != CMD_HELLO) {
            throw refuse{fmt("first command %u is not HELLO", rbuf[rpos])};
        }
        if (size != HELLO_REQ) {
            throw refuse{fmt("HELLO of %" PRIu64 " bytes", size)};
        }
        need(9 + HELLO_REQ, wait::hello);
        send_server(rbuf.data() + rpos, 9 + HELLO_REQ);
        rpos += 9 + HELLO_REQ;
        relay_reply(HELLO_RSP);
        out.messages++;
        return true;
    }

    bool one_message() {
        need(9, wait::idle);
        const uint8_t cmd = rbuf[rpos];
        uint64_t size;
        memcpy(&size, rbuf.data() + rpos + 1, 8);
        out.command = cmd_name(cmd);
        out.messages++;
        switch (cmd) {
            case CMD_SET_TENSOR:
                set_tensor(size);
                return true;
            case CMD_GRAPH_COMPUTE:
                graph_compute(size);
                return true;
            default:
                break;
        }
        size_t want;
        switch (cmd) {
            case CMD_ALLOC_BUFFER: want = sizeof(alloc_buffer_req); break;
            case CMD_GET_ALIGNMENT:
            case CMD_GET_MAX_SIZE:
            case CMD_GET_DEVICE_MEMORY:
            case CMD_GRAPH_RECOMPUTE: want = 4; break;
            case CMD_BUFFER_GET_BASE:
            case CMD_FREE_BUFFER: want = 8; break;
            case CMD_BUFFER_CLEAR: want = sizeof(buffer_clear_req); break;
            case CMD_SET_TENSOR_HASH: want = sizeof(set_tensor_hash_req); break;
            case CMD_GET_TENSOR: want = sizeof(get_tensor_req); break;
            case CMD_COPY_TENSOR: want = sizeof(copy_tensor_req); break;
            case CMD_INIT_TENSOR: want = sizeof(rpc_tensor); break;
            case CMD_GET_ALLOC_SIZE: want = sizeof(get_alloc_size_req); break;
            case CMD_DEVICE_COUNT: want = 0; break;
            case CMD_MEMSET_TENSOR: want = sizeof(memset_tensor_req); break;
            case CMD_HELLO: throw refuse{"a second HELLO"};
            default: throw refuse{fmt("unknown command %u", cmd)};
        }
        if (size != want) {
            throw refuse{fmt("%" PRIu64 " bytes where the command has %zu", size, want)};
        }
        need(9 + want, wait::mid);
        uint64_t reply = 0;  // bytes of upstream's reply, 0: none
        ggml_tensor t0, t1;
        switch (cmd) {
            case CMD_ALLOC_BUFFER: {
                alloc_buffer_req r;
                payload(r);
                device_arg(r.device);
                if (r.size == 0) {
                    throw refuse{"ALLOC_BUFFER of 0 bytes (a stock client never sends one)"};
                }
                if (r.size > alloc_cap - std::min(alloc_cap, allocated) || buffers.size() >= L.max_buffers) {
                    // a refused allocation, not a malformed message: answer as upstream does when
                    // the device is out of memory, and keep the session
                    out.alloc_denied++;
                    out.refusals++;
                    fprintf(stderr, "hydra: denied a ggml-RPC ALLOC_BUFFER of %" PRIu64 " bytes (%" PRIu64 " of %" PRIu64 " allocated, %zu buffers)\n",
                            r.size, allocated, alloc_cap, buffers.size());
                    rpos += 9 + want;
                    uint8_t rsp[8 + sizeof(alloc_buffer_rsp)] = {};
                    rsp[0] = sizeof(alloc_buffer_rsp);
                    send_client(rsp, sizeof(rsp));
                    return true;
                }
                send_server(rbuf.data() + rpos, 9 + want);
                rpos += 9 + want;
                alloc_buffer_rsp rsp;
                relay_reply(sizeof(rsp), &rsp, sizeof(rsp));
                if (rsp.remote_ptr != 0) {
                    // the pointer is upstream's ggml_backend_buffer_t in this process, and upstream
                    // waits for our next message: reading its base here is race-free
                    auto buf = (ggml_backend_buffer_t) (uintptr_t) rsp.remote_ptr;
                    buffers.push_back({rsp.remote_ptr, (uint64_t) (uintptr_t) ggml_backend_buffer_get_base(buf),
                                       (uint64_t) ggml_backend_buffer_get_size(buf), r.device, 0});
                    last = nullptr;
                    allocated += buffers.back().size;
                    out.alloc_bytes_peak = std::max(out.alloc_bytes_peak, allocated);
                }
                return true;
            }
            case CMD_GET_ALIGNMENT:
            case CMD_GET_MAX_SIZE:
            case CMD_GET_DEVICE_MEMORY: {
                uint32_t d;
                payload(d);
                device_arg(d);
                reply = cmd == CMD_GET_DEVICE_MEMORY ? 16 : 8;
                break;
            }
            case CMD_GRAPH_RECOMPUTE: {
                uint32_t d;
                payload(d);
                device_arg(d);
                if (!stored[d].valid) {
                    throw refuse{stored[d].why.empty() ? "GRAPH_RECOMPUTE with no computed graph" : stored[d].why};
                }
                break;
            }
            case CMD_BUFFER_GET_BASE:
            case CMD_FREE_BUFFER: {
                uint64_t p;
                payload(p);
                buf_info * b = find_buffer(p);
                if (b == nullptr) {
                    throw refuse{fmt("buffer 0x%" PRIx64 " is not a live buffer of this session", p)};
                }
                if (cmd == CMD_BUFFER_GET_BASE) {
                    reply = 8;
                    break;
                }
                for (auto & g : stored) {
                    for (uint64_t q : g.buffers) {
                        if (q == p && g.valid) {
                            g.valid = false;
                            g.why = "GRAPH_RECOMPUTE of a graph whose buffer was freed";
                        }
                    }
                }
                allocated -= b->size;
                *b = buffers.back();
                buffers.pop_back();
                last = nullptr;
                break;
            }
            case CMD_BUFFER_CLEAR: {
                buffer_clear_req r;
                payload(r);
                if (find_buffer(r.remote_ptr) == nullptr) {
                    throw refuse{fmt("buffer 0x%" PRIx64 " is not a live buffer of this session", r.remote_ptr)};
                }
                break;
            }
            case CMD_SET_TENSOR_HASH: {
                set_tensor_hash_req r;
                payload(r);
                tensor(r.tensor, t0, true, -1);
                region(r.tensor, r.offset, 0, "SET_TENSOR_HASH");
                // the data's size is known only once the hash resolves: the weights index checks it
                // against this bound on upstream's thread; a cache file is checked here
                buf_info * b = find_buffer(r.tensor.buffer);
                uint64_t room = std::min<uint64_t>(nbytes - std::min(nbytes, r.offset), b->base + b->size - (r.tensor.data + r.offset));
                if (!cache_dir.empty()) {
                    char name[17];
                    snprintf(name, sizeof(name), "%016" PRIx64, r.hash);
                    struct stat st;
                    if (stat((cache_dir + "/" + name).c_str(), &st) == 0 && (uint64_t) st.st_size > room) {
                        throw refuse{"SET_TENSOR_HASH: the cached data does not fit the tensor"};
                    }
                }
                {
                    std::lock_guard<std::mutex> lock(bound->mutex);
                    bound->max_size = room;
                }
                reply = 1;
                break;
            }
            case CMD_GET_TENSOR: {
                get_tensor_req r;
                payload(r);
                tensor(r.tensor, t0, true, -1);
                region(r.tensor, r.offset, r.size, "GET_TENSOR");
                rpos += 9 + want;
                serve_get_tensor(t0, r.offset, r.size);
                return true;
            }
            case CMD_COPY_TENSOR: {
                copy_tensor_req r;
                payload(r);
                tensor(r.src, t0, true, -1);
                buf_info * db = nullptr;
                tensor(r.dst, t1, true, -1, &db);
                if ((u128) r.dst.data + ggml_nbytes(&t0) > (u128) db->base + db->size) {
                    throw refuse{"COPY_TENSOR: the source does not fit after dst"};
                }
                reply = 1;
                break;
            }
            case CMD_INIT_TENSOR: {
                rpc_tensor r;
                payload(r);
                buf_info * b = nullptr;
                tensor(r, t0, true, -1, &b);
                // a backend's init_tensor may pad the tensor to its allocation size (CUDA zeroes the
                // padding of quantized rows): the padded size must fit too
                size_t alloc = ggml_backend_buft_get_alloc_size(ggml_backend_buffer_get_type(t0.buffer), &t0);
                if ((u128) r.data + alloc > (u128) b->base + b->size) {
                    throw refuse{"INIT_TENSOR: the padded tensor does not fit in its buffer"};
                }
                break;
            }
            case CMD_GET_ALLOC_SIZE: {
                get_alloc_size_req r;
                payload(r);
                device_arg(r.device);
                tensor(r.tensor, t0, false, -1);
                for (int i = 0; i < GGML_MAX_SRC; i++) {
                    if (r.srcs[i].id != 0) {
                        tensor(r.srcs[i], t1, false, -1);
                    }
                }
                reply = 8;
                break;
            }
            case CMD_DEVICE_COUNT:
                reply = 4;
                break;
            case CMD_MEMSET_TENSOR: {
                memset_tensor_req r;
                payload(r);
                tensor(r.tensor, t0, true, -1);
                uint64_t n = ggml_nbytes(&t0);
                if (r.offset > n || r.size > n - r.offset) {
                    throw refuse{"MEMSET_TENSOR: region outside the tensor"};
                }
                if (ggml_backend_buffer_get_type(t0.buffer) == nullptr) {
                    throw refuse{"MEMSET_TENSOR: no buffer type"};
                }
                break;
            }
        }
        send_server(rbuf.data() + rpos, 9 + want);
        rpos += 9 + want;
        if (reply) {
            relay_reply(reply);
        }
        return true;
    }

    // | rpc_tensor | offset u64 | data |: the data is streamed once the target region is known to
    // lie in a live buffer, so a size claim never allocates more than the buffer it must fit in.
    void set_tensor(uint64_t size) {
        if (size < SET_TENSOR_HEAD) {
            throw refuse{fmt("SET_TENSOR of %" PRIu64 " bytes, shorter than its header", size)};
        }
        uint64_t largest = 0;
        for (const auto & b : buffers) {
            largest = std::max(largest, b.size);
        }
        if (size - SET_TENSOR_HEAD > largest) {
            throw refuse{fmt("SET_TENSOR of %" PRIu64 " bytes, larger than any live buffer", size)};
        }
        need(9 + SET_TENSOR_HEAD, wait::mid);
        rpc_tensor w;
        uint64_t offset;
        memcpy(&w, rbuf.data() + rpos + 9, sizeof(w));
        memcpy(&offset, rbuf.data() + rpos + 9 + sizeof(w), 8);
        ggml_tensor t;
        tensor(w, t, true, -1);
        region(w, offset, size - SET_TENSOR_HEAD, "SET_TENSOR");
        // upstream sizes its input vector from the header: the first data bytes go with it
        if (size > SET_TENSOR_HEAD) {
            need(9 + SET_TENSOR_HEAD + 1, wait::mid);
        }
        uint64_t now = std::min<uint64_t>(avail(), 9 + size);
        send_server(rbuf.data() + rpos, now);
        rpos += now;
        stream_client_to_server(9 + size - now);
    }

    struct stored_graph {
        bool valid = false;
        std::string why;
        std::vector<uint64_t> buffers;
    };

    uint32_t find_id(uint64_t id) const {
        size_t mask = slots.size() - 1;
        for (size_t h = (id * 0x9E3779B97F4A7C15ull) >> 20 & mask;; h = (h + 1) & mask) {
            uint32_t s = slots[h];
            if (s == 0) {
                return UINT32_MAX;
            }
            if (ids[s - 1] == id) {
                return s - 1;
            }
        }
    }

    void graph_compute(uint64_t size) {
        if (size < 12 || size > L.max_message_bytes) {
            throw refuse{fmt("GRAPH_COMPUTE of %" PRIu64 " bytes (limit %" PRIu64 ")", size, L.max_message_bytes)};
        }
        // The whole graph is needed before any of it can be judged; it is taken as it arrives (and
        // its counts checked as soon as they are in), so a size claim alone holds no memory.
        gmsg.clear();
        auto take = [&](uint64_t upto) {
            while (gmsg.size() < upto) {
                if (avail() == 0) {
                    read_more(wait::mid);
                }
                size_t m = (size_t) std::min<uint64_t>(avail(), upto - gmsg.size());
                gmsg.insert(gmsg.end(), rbuf.data() + rpos, rbuf.data() + rpos + m);
                rpos += m;
            }
        };
        take(9 + 8);
        uint32_t device, n_nodes, n_tensors;
        memcpy(&device, gmsg.data() + 9, 4);
        memcpy(&n_nodes, gmsg.data() + 13, 4);
        device_arg(device);
        if (n_nodes > L.max_graph_nodes) {
            throw refuse{fmt("GRAPH_COMPUTE of %u nodes (limit %u)", n_nodes, L.max_graph_nodes)};
        }
        if (size < 12 + 8ull * n_nodes) {
            throw refuse{fmt("GRAPH_COMPUTE: %u nodes do not fit in %" PRIu64 " bytes", n_nodes, size)};
        }
        take(9 + 12 + 8ull * n_nodes);
        memcpy(&n_tensors, gmsg.data() + 9 + 8 + 8ull * n_nodes, 4);
        if (n_tensors > L.max_graph_tensors) {
            throw refuse{fmt("GRAPH_COMPUTE of %u tensors (limit %u)", n_tensors, L.max_graph_tensors)};
        }
        if (size != 12 + 8ull * n_nodes + (uint64_t) n_tensors * sizeof(rpc_tensor)) {
            throw refuse{fmt("GRAPH_COMPUTE: %u nodes and %u tensors in %" PRIu64 " bytes", n_nodes, n_tensors, size)};
        }
        take(9 + size);
        const uint8_t * p = gmsg.data() + 9;
        const uint8_t * node_ids = p + 8;
        const rpc_tensor * wt = (const rpc_tensor *) (p + 12 + 8ull * n_nodes);  // gmsg is 8-aligned + 21: read by memcpy below

        // ids -> index (open addressing, reused across graphs)
        size_t cap = 16;
        while (cap < 2ull * n_tensors) {
            cap <<= 1;
        }
        slots.assign(cap, 0);
        ids.resize(n_tensors);
        tens.resize(n_tensors);
        wire.resize(n_tensors);
        memcpy(wire.data(), wt, (size_t) n_tensors * sizeof(rpc_tensor));
        for (uint32_t i = 0; i < n_tensors; i++) {
            uint64_t id = wire[i].id;
            if (id == 0) {
                throw refuse{fmt("GRAPH_COMPUTE: tensor %u has id 0", i)};
            }
            if (find_id(id) != UINT32_MAX) {
                throw refuse{fmt("GRAPH_COMPUTE: tensor id %" PRIu64 " twice", id)};
            }
            ids[i] = id;
            size_t mask = cap - 1;
            size_t h = (id * 0x9E3779B97F4A7C15ull) >> 20 & mask;
            while (slots[h] != 0) {
                h = (h + 1) & mask;
            }
            slots[h] = i + 1;
        }
        epoch++;
        used.clear();
        for (uint32_t i = 0; i < n_tensors; i++) {
            buf_info * b = nullptr;
            // a tensor the head never allocated (no buffer, no data: an unused leaf) is accepted as
            // upstream accepts it; a node that computes into it or reads it is refused below
            tensor(wire[i], tens[i], false, (int) device, &b);
            if (b == nullptr) {
                if (wire[i].data != 0) {
                    throw refuse{fmt("GRAPH_COMPUTE: tensor %" PRIu64 " has data but no buffer", wire[i].id)};
                }
                continue;
            }
            if (b->mark != epoch) {
                b->mark = epoch;
                used.push_back(b->ptr);
            }
        }
        for (uint32_t i = 0; i < n_tensors; i++) {
            const rpc_tensor & w = wire[i];
            for (int j = 0; j < GGML_MAX_SRC; j++) {
                if (w.src[j] != 0) {
                    uint32_t k = find_id(w.src[j]);
                    if (k == UINT32_MAX) {
                        throw refuse{fmt("GRAPH_COMPUTE: tensor %" PRIu64 " src[%d] %" PRIu64 " names no tensor", w.id, j, w.src[j])};
                    }
                    tens[i].src[j] = &tens[k];
                }
            }
            if (w.view_src != 0) {
                uint32_t k = find_id(w.view_src);
                if (k == UINT32_MAX) {
                    throw refuse{fmt("GRAPH_COMPUTE: tensor %" PRIu64 " view_src %" PRIu64 " names no tensor", w.id, w.view_src)};
                }
                if (tens[k].buffer != tens[i].buffer) {
                    throw refuse{fmt("GRAPH_COMPUTE: view %" PRIu64 " in another buffer than its source", w.id)};
                }
                tens[i].view_src = &tens[k];
            }
        }
        depth_check(n_tensors);
        ggml_backend_dev_t dev = ggml_backend_get_device(backends[device]);
        for (uint32_t i = 0; i < n_nodes; i++) {
            uint64_t id;
            memcpy(&id, node_ids + 8ull * i, 8);
            uint32_t k = id == 0 ? UINT32_MAX : find_id(id);
            if (k == UINT32_MAX) {
                throw refuse{fmt("GRAPH_COMPUTE: node %u id %" PRIu64 " names no tensor", i, id)};
            }
            const ggml_tensor * t = &tens[k];
            if (ggml_op_is_empty_view(t->op) && t->src[0] == nullptr) {
                throw refuse{fmt("GRAPH_COMPUTE: node %u (%s) is a view without a source", i, ggml_op_desc(t))};
            }
            if (ggml_is_empty(t) || t->op == GGML_OP_NONE || ggml_op_is_empty_view(t->op)) {
                // backends skip these nodes (ggml-cpu.c ggml_graph_compute_thread, ggml-cuda's
                // graph loop; views compute nothing): no op rule applies (an empty MUL_MAT of a
                // micro-batch with no outputs has strides such as 2048, 0, 0)
                continue;
            }
            if (t->data == nullptr) {
                throw refuse{fmt("GRAPH_COMPUTE: node %u (%s) computes into a tensor with no buffer", i, ggml_op_desc(t))};
            }
            for (int j = 0; j < GGML_MAX_SRC; j++) {
                const ggml_tensor * s = t->src[j];
                if (s != nullptr && s->data == nullptr && !ggml_is_empty(s)) {
                    throw refuse{fmt("GRAPH_COMPUTE: node %u (%s) reads src[%d] (%s, ne %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 ") with no buffer", i, ggml_op_desc(t), j, ggml_op_desc(s), s->ne[0], s->ne[1], s->ne[2], s->ne[3])};
                }
            }
            if (const char * why = op_check(t)) {
                throw refuse{fmt("GRAPH_COMPUTE: node %u (%s): %s [ne %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " nb %zu %zu %zu %zu]", i, ggml_op_desc(t), why, t->ne[0], t->ne[1], t->ne[2], t->ne[3], t->nb[0], t->nb[1], t->nb[2], t->nb[3])};
            }
            if (t->op != GGML_OP_NONE && !ggml_op_is_empty_view(t->op) && !ggml_backend_dev_supports_op(dev, t)) {
                throw refuse{fmt("GRAPH_COMPUTE: node %u (%s) not supported by %s", i, ggml_op_desc(t), ggml_backend_dev_name(dev))};
            }
        }
        send_server(gmsg.data(), gmsg.size());
        stored[device].valid = true;
        stored[device].why.clear();
        stored[device].buffers.assign(used.begin(), used.end());
    }

    static bool ggml_op_is_empty_view(ggml_op op) {
        return op == GGML_OP_VIEW || op == GGML_OP_RESHAPE || op == GGML_OP_PERMUTE || op == GGML_OP_TRANSPOSE;
    }

    // Upstream builds the graph by recursing over src and view_src from each node: bound the
    // longest such chain (and refuse cycles) with an explicit stack, never recursion on wire data.
    void depth_check(uint32_t n) {
        color.assign(n, 0);
        depth.assign(n, 0);
        for (uint32_t root = 0; root < n; root++) {
            if (color[root] != 0) {
                continue;
            }
            stack.clear();
            stack.push_back({root, 0});
            color[root] = 1;
            while (!stack.empty()) {
                auto & top = stack.back();
                const ggml_tensor * t = &tens[top.first];
                if (top.second > GGML_MAX_SRC) {
                    // post-order: every source is done, so its chain length is known
                    uint32_t d = 1;
                    for (int j = 0; j <= GGML_MAX_SRC; j++) {
                        const ggml_tensor * s = j < GGML_MAX_SRC ? t->src[j] : t->view_src;
                        if (s != nullptr) {
                            d = std::max(d, depth[(uint32_t) (s - tens.data())] + 1);
                        }
                    }
                    if (d > L.max_graph_depth) {
                        throw refuse{fmt("GRAPH_COMPUTE: sources nest deeper than %u", L.max_graph_depth)};
                    }
                    depth[top.first] = d;
                    color[top.first] = 2;
                    stack.pop_back();
                    continue;
                }
                const ggml_tensor * next = top.second < GGML_MAX_SRC ? t->src[top.second] : t->view_src;
                top.second++;
                // ggml_cast makes its result its own src[1] (the CPY destination; backend
                // sampling's dist casts so); upstream's graph walk sees it as visited already.
                if (next == nullptr || next == t) {
                    continue;
                }
                uint32_t k = (uint32_t) (next - tens.data());
                if (color[k] == 1) {
                    throw refuse{"GRAPH_COMPUTE: a cycle of tensor sources"};
                }
                if (color[k] == 0) {
                    color[k] = 1;
                    stack.push_back({k, 0});
                }
            }
        }
    }

    int cfd, sfd;
    const std::vector<ggml_backend_t> & backends;
    hydra_rpc_limits L;
    std::string cache_dir;
    hydra_rpc_hash_bound * bound;
    uint64_t * n_cmds;
    bool busy = false;  // a relayed command may still be running in upstream
    uint64_t nbytes = 0;  // of the last tensor checked
    hydra_rpc_guard_outcome & out;
    std::chrono::steady_clock::time_point start;
    std::vector<uint8_t> rbuf;
    size_t rpos = 0, rlen = 0;
    std::vector<uint8_t> chunk;
    std::vector<buf_info> buffers;
    buf_info * last = nullptr;
    uint64_t allocated = 0;
    uint64_t alloc_cap = 0;
    std::vector<stored_graph> stored;
    uint32_t epoch = 0;
    // graph scratch, reused by every GRAPH_COMPUTE of the session
    std::vector<uint8_t> gmsg;
    std::vector<uint32_t> slots;
    std::vector<uint64_t> ids;
    std::vector<rpc_tensor> wire;
    std::vector<ggml_tensor> tens;
    std::vector<uint64_t> used;
    std::vector<uint8_t> color;
    std::vector<uint32_t> depth;
    std::vector<std::pair<uint32_t, uint32_t>> stack;


public:
    void run_all() {
        try {
            run();
        } catch (const stop &) {
        }
    }
};

}  // namespace

// GPU devices: their total memory (a client that needs more cannot be a real head; the driver
// refuses past what is free anyway). The CPU device: half of the host's memory, so one session
// alone cannot push the engine into swap or the OOM killer.
uint64_t hydra_rpc_default_alloc_cap(const std::vector<ggml_backend_t> & backends) {
    uint64_t cap = 0;
    for (ggml_backend_t b : backends) {
        ggml_backend_dev_t dev = ggml_backend_get_device(b);
        size_t free = 0, total = 0;
        ggml_backend_dev_memory(dev, &free, &total);
        cap += ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU ? total / 2 : total;
    }
    return cap;
}

const void * hydra_weights_resolve(void * user_data, uint64_t hash, size_t * size);

const void * hydra_rpc_guarded_resolve(void * bound, uint64_t hash, size_t * size) {
    size_t n = 0;
    const void * data = hydra_weights_resolve(nullptr, hash, &n);
    if (data == nullptr) {
        return nullptr;
    }
    auto * b = static_cast<hydra_rpc_hash_bound *>(bound);
    std::lock_guard<std::mutex> lock(b->mutex);
    if (n > b->max_size) {
        fprintf(stderr, "hydra: a ggml-RPC SET_TENSOR_HASH hit of %zu bytes does not fit its tensor (%" PRIu64 "): answered as a miss\n", n, b->max_size);
        return nullptr;
    }
    *size = n;
    return data;
}

void hydra_rpc_guard_run(int client_fd, int server_fd, const std::vector<ggml_backend_t> & backends,
                         const hydra_rpc_limits & limits, const char * cache_dir, hydra_rpc_hash_bound * bound,
                         uint64_t * n_cmds, hydra_rpc_guard_outcome & out) {
    int flags = fcntl(client_fd, F_GETFL, 0);
    fcntl(client_fd, F_SETFL, flags | O_NONBLOCK);
    guard g(client_fd, server_fd, backends, limits, cache_dir, bound, n_cmds, out);
    g.run_all();
    fcntl(client_fd, F_SETFL, flags);
}
