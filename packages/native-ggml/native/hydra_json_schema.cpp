// JSON schema -> GBNF with the pinned llama.cpp's own converter (common/json-schema-to-grammar.cpp
// and common/json.cpp, compiled into the addon; see CMakeLists.txt), plus the three string helpers
// of common/common.cpp it calls, copied verbatim: linking all of libllama-common for them would add
// a 5.7 MB library to every build and bundle.
#include "json-schema-to-grammar.h"
#include "json.h"

#include <sstream>
#include <string>
#include <vector>

std::string string_join(const std::vector<std::string> & values, const std::string & separator) {
    std::ostringstream result;
    for (size_t i = 0; i < values.size(); ++i) {
        if (i > 0) {
            result << separator;
        }
        result << values[i];
    }
    return result.str();
}

std::vector<std::string> string_split(const std::string & str, const std::string & delimiter) {
    std::vector<std::string> parts;
    size_t start = 0;
    size_t end = str.find(delimiter);

    while (end != std::string::npos) {
        parts.push_back(str.substr(start, end - start));
        start = end + delimiter.length();
        end = str.find(delimiter, start);
    }

    parts.push_back(str.substr(start));

    return parts;
}

std::string string_repeat(const std::string & str, size_t n) {
    if (n == 0) {
        return "";
    }

    std::string result;
    result.reserve(str.length() * n);

    for (size_t i = 0; i < n; ++i) {
        result += str;
    }

    return result;
}

// Throws (common_json_error, std::invalid_argument, ...) when the text is not JSON or the schema
// cannot be converted; the caller turns that into HYDRA_ERR_BAD_ARGUMENT.
std::string hydra_json_schema_to_grammar(const std::string & schema) {
    return json_schema_to_grammar(common_json::parse(schema));
}
