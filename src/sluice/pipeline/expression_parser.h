// Recursive-descent parser of the expression language (docs/expressions.md): tokens -> ExprNode tree, with
// constant folding. Private to src/sluice/pipeline.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "sluice/pipeline/expression_node.h"

namespace sluice::pipeline::detail {

struct ParsedItem {
  NodePtr node;       ///< null for a star item
  std::string name;   ///< output name; "*" for a star item
  std::string text;   ///< the item's expression text
  size_t offset = 0;  ///< where the item starts
};

/// Parses one expression spanning all of `text`; appends a copy of every field path it reads to `paths` when
/// given. Throws CompileError.
NodePtr parse_expression(std::string_view text, std::vector<PathNode>* paths = nullptr);
/// Parses a projection: `*` and `expr [AS name]` items separated by commas. Throws CompileError.
std::vector<ParsedItem> parse_projection(std::string_view text);

}  // namespace sluice::pipeline::detail
