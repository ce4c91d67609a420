// Chat through the pinned llama.cpp's common chat layer (common/chat.cpp, its Jinja engine in
// common/jinja/, the PEG and auto parsers), compiled into the addon as json-schema-to-grammar is
// (CMakeLists.txt says which files and why not libllama-common). The request body is read here
// with llama-server's own rules (tools/server/server-common.cpp, oaicompat_chat_params_parse), so
// a prompt rendered here is the prompt llama-server renders for the same body.
#include "hydra_common.h"

#include "chat.h"
#include "common.h"
#include "json.h"
#include "log.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>

// The four common.cpp functions the chat files call, copied verbatim from the pinned tree (as
// hydra_json_schema.cpp copies three): common.cpp itself pulls in the rest of libllama-common.
std::vector<llama_token> common_tokenize(
    const struct llama_vocab * vocab,
           const std::string & text,
                        bool   add_special,
                        bool   parse_special) {
    // upper limit for the number of tokens
    int n_tokens = text.length() + 2 * add_special;
    std::vector<llama_token> result(n_tokens);
    n_tokens = llama_tokenize(vocab, text.data(), text.length(), result.data(), result.size(), add_special, parse_special);
    if (n_tokens == std::numeric_limits<int32_t>::min()) {
        throw std::runtime_error("Tokenization failed: input text too large, tokenization result exceeds int32_t limit");
    }
    if (n_tokens < 0) {
        result.resize(-n_tokens);
        int check = llama_tokenize(vocab, text.data(), text.length(), result.data(), result.size(), add_special, parse_special);
        GGML_ASSERT(check == -n_tokens);
    } else {
        result.resize(n_tokens);
    }
    return result;
}

std::string common_token_to_piece(const struct llama_vocab * vocab, llama_token token, bool special) {
    std::string piece;
    piece.resize(piece.capacity());  // using string internal cache, 15 bytes + '\n'
    const int n_chars = llama_token_to_piece(vocab, token, &piece[0], piece.size(), 0, special);
    if (n_chars < 0) {
        piece.resize(-n_chars);
        int check = llama_token_to_piece(vocab, token, &piece[0], piece.size(), 0, special);
        GGML_ASSERT(check == -n_chars);
    }
    else {
        piece.resize(n_chars);
    }

    return piece;
}

void string_replace_all(std::string & s, const std::string & search, const std::string & replace) {
    if (search.empty()) {
        return;
    }
    std::string builder;
    builder.reserve(s.length());
    size_t pos = 0;
    size_t last_pos = 0;
    while ((pos = s.find(search, last_pos)) != std::string::npos) {
        builder.append(s, last_pos, pos - last_pos);
        builder.append(replace);
        last_pos = pos + search.length();
    }
    builder.append(s, last_pos, std::string::npos);
    s = std::move(builder);
}

bool tty_can_use_colors() {
    // Check NO_COLOR environment variable (https://no-color.org/)
    if (const char * no_color = std::getenv("NO_COLOR")) {
        if (no_color[0] != '\0') {
            return false;
        }
    }

    // Check TERM environment variable
    if (const char * term = std::getenv("TERM")) {
        if (std::strcmp(term, "dumb") == 0) {
            return false;
        }
    }

    // Check if stdout and stderr are connected to a terminal
    // We check both because log messages can go to either
    bool stdout_is_tty = isatty(fileno(stdout));
    bool stderr_is_tty = isatty(fileno(stderr));

    return stdout_is_tty || stderr_is_tty;
}

std::vector<llama_token> hydra_tokenize_text(const llama_vocab * vocab, const std::string & text, bool add_special, bool parse_special);  // hydra_addon.cpp

namespace {

using json = common_json;

template <typename T> T value_or(const json & body, const char * key, const T & fallback) {
    if (!body.contains(key) || body.at(key).is_null()) {
        return fallback;
    }
    return body.at(key).get<T>();
}

const char * trigger_type_name(common_grammar_trigger_type t) {
    switch (t) {
        case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN: return "token";
        case COMMON_GRAMMAR_TRIGGER_TYPE_WORD: return "word";
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN: return "pattern";
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: return "pattern_full";
    }
    return "unknown";
}

// common's LOG_* go through a logger thread that prints to stdout; the engine owns its output.
void quiet_common_log() {
    static std::once_flag once;
    std::call_once(once, [] { common_log_set_verbosity_thold(-1); common_log_pause(common_log_main()); });
}

// Applies the templates to an OpenAI chat body (JSON text) and returns what generation needs.
std::string chat_apply(const llama_model * model, const std::string & override_tmpl, const std::string & body_text, const std::string & opts_text,
                       const std::string & messages_text, std::vector<llama_token> * tokens) {
    json body = json::parse(body_text);
    if (!messages_text.empty()) {
        body["messages"] = json::parse(messages_text);
    }
    json opts = opts_text.empty() ? json::object() : json::parse(opts_text);
    common_chat_templates_ptr tmpls = common_chat_templates_init(model, override_tmpl);
    const bool use_jinja = value_or<bool>(opts, "use_jinja", true);

    json tools = value_or<json>(body, "tools", json());
    const bool has_tools = tools.is_array() && !tools.empty();
    std::string tool_choice = "auto";
    if (body.contains("tool_choice") && !body.at("tool_choice").is_null()) {
        const json & tc = body.at("tool_choice");
        if (tc.is_string()) {
            tool_choice = tc.get<std::string>();
        } else if (tc.is_object() && tc.contains("function") && tc.at("function").contains("name")) {
            // A named tool: upstream's oaicompat parse takes strings only, so the named form is
            // the tool list narrowed to that tool with the call required (OpenAI's meaning).
            const std::string name = tc.at("function").at("name").get<std::string>();
            json only = json::array();
            for (const auto & t : tools) {
                if (t.contains("function") && t.at("function").value("name", "") == name) {
                    only.push_back(t);
                }
            }
            if (only.empty()) {
                throw std::invalid_argument("tool_choice names a function that is not in tools: " + name);
            }
            tools = only;
            tool_choice = "required";
        } else {
            throw std::invalid_argument("tool_choice must be \"none\", \"auto\", \"required\" or {\"type\":\"function\",\"function\":{\"name\":...}}");
        }
    }
    if (!use_jinja) {
        if (has_tools) {
            throw std::invalid_argument("tools param requires --jinja flag");
        }
        if (tool_choice != "auto") {
            throw std::invalid_argument("tool_choice param requires --jinja flag");
        }
    }
    if (!body.contains("messages") || !body.at("messages").is_array()) {
        throw std::invalid_argument("'messages' is required and must be an array");
    }
    for (const auto & msg : body.at("messages")) {
        const std::string role = msg.value("role", "");
        if (role != "assistant" && !msg.contains("content")) {
            throw std::invalid_argument("All non-assistant messages must contain 'content'");
        }
        if (role == "assistant" && !msg.contains("content") && !msg.contains("tool_calls")) {
            throw std::invalid_argument("Assistant message must contain either 'content' or 'tool_calls'!");
        }
    }

    auto caps = common_chat_templates_get_caps(tmpls.get());
    common_chat_templates_inputs inputs;
    inputs.messages = common_chat_msgs_parse_oaicompat(body.at("messages"));
    inputs.tools = common_chat_tools_parse_oaicompat(tools);
    inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(tool_choice);
    inputs.use_jinja = use_jinja;
    inputs.parallel_tool_calls = value_or<bool>(body, "parallel_tool_calls", caps["supports_parallel_tool_calls"]);
    inputs.add_generation_prompt = value_or<bool>(body, "add_generation_prompt", true);
    // llama-server's prefill_assistant (default on): a last assistant message is continued.
    if (!inputs.messages.empty() && inputs.messages.back().role == "assistant") {
        if (inputs.messages.size() >= 2 && inputs.messages[inputs.messages.size() - 2].role == "assistant") {
            throw std::invalid_argument("Cannot have 2 or more assistant messages at the end of the list.");
        }
        if (!inputs.messages.back().tool_calls.empty()) {
            throw std::invalid_argument("Cannot continue an assistant message that contains tool calls.");
        }
        inputs.continue_final_message = COMMON_CHAT_CONTINUATION_AUTO;
        inputs.add_generation_prompt = false;
    }
    inputs.reasoning_format = common_reasoning_format_from_name(value_or<std::string>(opts, "reasoning_format", "auto"));
    if (body.contains("reasoning_format") && !body.at("reasoning_format").is_null()) {
        inputs.reasoning_format = common_reasoning_format_from_name(body.at("reasoning_format").get<std::string>());
    }
    inputs.enable_thinking = value_or<bool>(opts, "enable_thinking", true);
    if (opts.contains("chat_template_kwargs")) {
        for (const auto & item : opts.at("chat_template_kwargs").items()) {
            inputs.chat_template_kwargs[item.key()] = item.value().dump();
        }
    }
    if (body.contains("chat_template_kwargs") && !body.at("chat_template_kwargs").is_null()) {
        if (!body.at("chat_template_kwargs").is_object()) {
            throw std::invalid_argument("chat_template_kwargs must be an object");
        }
        for (const auto & item : body.at("chat_template_kwargs").items()) {
            inputs.chat_template_kwargs[item.key()] = item.value().dump();
        }
    }
    auto et = inputs.chat_template_kwargs.find("enable_thinking");
    if (et != inputs.chat_template_kwargs.end()) {
        if (et->second == "true") {
            inputs.enable_thinking = true;
        } else if (et->second == "false") {
            inputs.enable_thinking = false;
        } else if (!et->second.empty() && et->second[0] == '"') {
            throw std::invalid_argument("invalid type for \"enable_thinking\" (expected boolean, got string)");
        }
    }
    if (body.contains("reasoning_effort") && body.at("reasoning_effort").is_string()) {
        const std::string effort = body.at("reasoning_effort").get<std::string>();
        if (effort == "none") {
            inputs.enable_thinking = false;
            inputs.chat_template_kwargs.erase("reasoning_effort");
        } else if (!effort.empty()) {
            inputs.chat_template_kwargs["reasoning_effort"] = json(effort).dump();
        }
    }

    common_chat_params p = common_chat_templates_apply(tmpls.get(), inputs);
    json out = {
        {"prompt", p.prompt},
        {"format", (int) p.format},
        {"format_name", common_chat_format_name(p.format)},
        {"grammar", p.grammar},
        {"grammar_lazy", p.grammar_lazy},
        {"generation_prompt", p.generation_prompt},
        {"supports_thinking", p.supports_thinking},
        {"preserved_tokens", p.preserved_tokens},
        {"additional_stops", p.additional_stops},
        {"parser", p.parser},
        {"reasoning_format", common_reasoning_format_name(inputs.reasoning_format)},
        {"parse_tool_calls", !inputs.tools.empty() && inputs.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE},
    };
    if (tokens != nullptr) {
        // The prompt stays here: a chat of 150k messages renders to megabytes the JS thread would parse.
        const llama_vocab * vocab = llama_model_get_vocab(model);
        *tokens = hydra_tokenize_text(vocab, p.prompt, llama_vocab_get_add_bos(vocab), true);
        out["prompt"] = "";
        out["prompt_bytes"] = p.prompt.size();
    }
    json triggers = json::array();
    for (const auto & t : p.grammar_triggers) {
        json one = {{"type", trigger_type_name(t.type)}, {"value", t.value}};
        if (t.type == COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN) {
            one["token"] = t.token;
        }
        triggers.push_back(one);
    }
    out["grammar_triggers"] = triggers;
    return out.dump();
}

// Parses generated text with what chat_apply returned: content, reasoning_content, tool_calls.
std::string chat_parse(const std::string & args_text) {
    json a = json::parse(args_text);
    common_chat_parser_params pp;
    pp.format = (common_chat_format) a.at("format").get<int>();
    if (pp.format < 0 || pp.format >= COMMON_CHAT_FORMAT_COUNT) {
        throw std::invalid_argument("unknown chat format");
    }
    pp.reasoning_format = common_reasoning_format_from_name(value_or<std::string>(a, "reasoning_format", "none"));
    pp.generation_prompt = value_or<std::string>(a, "generation_prompt", "");
    pp.parse_tool_calls = value_or<bool>(a, "parse_tool_calls", true);
    const std::string parser = value_or<std::string>(a, "parser", "");
    if (!parser.empty()) {
        pp.parser.load(parser);
    }
    common_chat_msg msg = common_chat_parse(a.at("text").get<std::string>(), value_or<bool>(a, "is_partial", false), pp);
    json out = msg.to_json_oaicompat();
    json calls = json::array();
    for (const auto & tc : msg.tool_calls) {
        calls.push_back({{"name", tc.name}, {"arguments", tc.arguments}, {"id", tc.id}});
    }
    out["hydra_tool_calls"] = calls;
    out["content_text"] = msg.content;
    out["reasoning_text"] = msg.reasoning_content;
    return out.dump();
}

class chat_worker : public Napi::AsyncWorker {
public:
    chat_worker(Napi::Env env, hydra_model * m, Napi::Value model_handle, std::string a, std::string b, std::string c, std::string messages = {},
                bool tokenize = false)
        : Napi::AsyncWorker(env), deferred(Napi::Promise::Deferred::New(env)), m(m), a(std::move(a)), b(std::move(b)), c(std::move(c)),
          messages(std::move(messages)), tokenize(tokenize) {
        if (m != nullptr) {
            model_ref = Napi::Persistent(model_handle);
        }
    }
    Napi::Promise promise() { return deferred.Promise(); }

    void Execute() override {
        quiet_common_log();
        try {
            out = m != nullptr ? chat_apply(m->model, a, b, c, messages, tokenize ? &tokens : nullptr) : chat_parse(a);
        } catch (const std::exception & e) {
            SetError(e.what());
        }
    }
    void OnOK() override {
        if (!tokenize) {
            deferred.Resolve(Napi::String::New(Env(), out));
            return;
        }
        Napi::Object r = Napi::Object::New(Env());
        r.Set("json", Napi::String::New(Env(), out));
        Napi::Int32Array arr = Napi::Int32Array::New(Env(), tokens.size());
        memcpy(arr.Data(), tokens.data(), sizeof(llama_token) * tokens.size());
        r.Set("tokens", arr);
        deferred.Resolve(r);
    }
    void OnError(const Napi::Error & e) override {
        deferred.Reject(hydra_error_make(Env(), HYDRA_ERR_BAD_ARGUMENT, e.Message()).Value());
    }

private:
    Napi::Promise::Deferred deferred;
    hydra_model * m;
    Napi::Reference<Napi::Value> model_ref;  // the model outlives the job
    std::string a, b, c, out, messages;
    bool tokenize;
    std::vector<llama_token> tokens;
};

std::string string_arg(const Napi::CallbackInfo & info, size_t i, const char * what) {
    if (info.Length() <= i || !info[i].IsString()) {
        hydra_error_throw(info.Env(), HYDRA_ERR_BAD_ARGUMENT, std::string(what) + " must be a string");
    }
    return info[i].As<Napi::String>().Utf8Value();
}

}  // namespace

// chatCommonApplyAsync(model, templateOverride, bodyJson, optionsJson, messagesJson?: Uint8Array, tokenize?)
//   -> Promise<JSON text>, or with tokenize Promise<{json, tokens: Int32Array}> (the prompt tokenized here)
Napi::Value hydra_chat_common_apply_async(const Napi::CallbackInfo & info) {
    hydra_model * m = hydra_handle_get<hydra_model>(info[0], "model");
    std::string messages;
    if (info.Length() > 4 && !info[4].IsUndefined() && !info[4].IsNull()) {
        if (!info[4].IsTypedArray() || info[4].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
            hydra_error_throw(info.Env(), HYDRA_ERR_BAD_ARGUMENT, "messages JSON must be a Uint8Array");
        }
        Napi::Uint8Array bytes = info[4].As<Napi::Uint8Array>();
        messages.assign(reinterpret_cast<const char *>(bytes.Data()), bytes.ByteLength());
    }
    auto * w = new chat_worker(info.Env(), m, info[0], string_arg(info, 1, "template override"), string_arg(info, 2, "body"),
                               string_arg(info, 3, "options"), std::move(messages), info.Length() > 5 && info[5].ToBoolean().Value());
    Napi::Promise p = w->promise();
    w->Queue();
    return p;
}

// chatCommonParseAsync(argsJson) -> Promise<JSON text of the parsed message>
Napi::Value hydra_chat_common_parse_async(const Napi::CallbackInfo & info) {
    auto * w = new chat_worker(info.Env(), nullptr, info.Env().Undefined(), string_arg(info, 0, "parse arguments"), "", "");
    Napi::Promise p = w->promise();
    w->Queue();
    return p;
}
