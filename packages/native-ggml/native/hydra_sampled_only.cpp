// The last stage of every sampler chain the addon attaches to a context for on-device sampling
// (issue 28): once the chain's device stages have sampled a token, it drops the logits, probability
// and candidate rows from the chain's outputs. llama.cpp's build_sampling makes every output a
// sampler leaves in llama_sampler_data a graph output, and decode then copies each of them back to
// the host per step (copy_tensor_async_rows skips only null tensors): greedy leaves the whole
// logits row there, dist also its softmax, so a step read n_vocab x 4 bytes or more (over ggml-RPC
// a GET_TENSOR of the row when the output layer is on a peer) to use a 4-byte id. The addon attaches
// a chain only to entries that read back the sampled id alone (no logits, no probabilities; see
// attach_samplers), so nothing reads those rows.
//
// The stage runs on the device only when every stage before it does (llama.cpp's chain runs its
// offloadable prefix on the device and the rest on the host); a chain with a host part never
// reaches it there, and its host apply is a no-op, so the host part still gets the rows it samples
// from. It keeps the rows when no token was sampled, for the same reason.
#include "hydra_common.h"

namespace {

const char * sampled_only_name(const llama_sampler *) {
    return "sampled-only";
}

void sampled_only_apply(llama_sampler *, llama_token_data_array *) {}

llama_sampler * sampled_only_clone(const llama_sampler *) {
    return hydra_sampler_init_sampled_only();
}

bool sampled_only_backend_init(llama_sampler *, ggml_backend_buffer_type_t, uint32_t) {
    return true;  // no tensors of its own, no ops
}

void sampled_only_backend_apply(llama_sampler *, ggml_context *, ggml_cgraph *, llama_sampler_data * data) {
    if (data->sampled == nullptr) {
        return;
    }
    data->logits = nullptr;
    data->probs = nullptr;
    data->candidates = nullptr;
}

llama_sampler_i sampled_only_i = {
    /* .name              = */ sampled_only_name,
    /* .accept            = */ nullptr,
    /* .apply             = */ sampled_only_apply,
    /* .reset             = */ nullptr,
    /* .clone             = */ sampled_only_clone,
    /* .free              = */ nullptr,
    /* .backend_init      = */ sampled_only_backend_init,
    /* .backend_accept    = */ nullptr,
    /* .backend_apply     = */ sampled_only_backend_apply,
    /* .backend_set_input = */ nullptr,
    /* .backend_reset     = */ nullptr,
    /* .copy_state        = */ nullptr,
};

}  // namespace

llama_sampler * hydra_sampler_init_sampled_only() {
    return llama_sampler_init(&sampled_only_i, nullptr);
}
