// The built-in scalar functions of the expression language (docs/expressions.md, "Functions"): a registry
// by upper-case name with arity and NULL handling. Private to src/sluice/pipeline.
#pragma once

#include <string>
#include <string_view>

#include "sluice/pipeline/expression_node.h"

namespace sluice::pipeline::detail {

struct FunctionSpec {
  std::string_view name;  ///< upper case
  int min_args = 0;
  int max_args = 0;          ///< -1: any number
  bool null_on_null = true;  ///< NULL when any argument is NULL
  FunctionImpl impl = nullptr;
  int regex_arg = -1;  ///< index of a regular-expression argument compiled once when it is a literal
};

/// The function called `upper_name`, or nullptr.
const FunctionSpec* find_function(std::string_view upper_name);
/// The closest known function name within a small edit distance, or "" (for "did you mean").
std::string suggest_function(std::string_view upper_name);
/// True for NOW, CURRENT_TIMESTAMP, RAND, UUID and the like: rejected at compile time because a replay
/// must produce the same output.
bool is_nondeterministic_function(std::string_view upper_name);
/// Compiles a regular expression (RE2 syntax: linear-time matching, no backreferences or lookaround); throws
/// EvalError naming the pattern and RE2's reason.
std::shared_ptr<const re2::RE2> compile_regex(std::string_view pattern);

}  // namespace sluice::pipeline::detail
