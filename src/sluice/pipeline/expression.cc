// Expression and Projection: compile through the parser, evaluate the node tree, and turn the internal
// CompileError / EvalError into the public error forms.
#include "sluice/pipeline/expression.h"

#include <new>
#include <stdexcept>

#include "sluice/pipeline/expression_lexer.h"
#include "sluice/pipeline/expression_node.h"
#include "sluice/pipeline/expression_parser.h"

namespace sluice::pipeline {

namespace {

Error compile_error(std::string_view text, const ExpressionError& e) {
  return Error(ErrorCode::kConfiguration,
               "expression '" + std::string(text) + "': at offset " + std::to_string(e.offset) + ": " + e.message);
}

Error runtime_error(const std::string& text, std::string_view reason) {
  return Error(ErrorCode::kRuntime, "expression '" + text + "': " + std::string(reason));
}

}  // namespace

Expression::Expression(std::shared_ptr<const detail::ExprNode> root, std::string text)
    : root_(std::move(root)), text_(std::move(text)) {
  if (const auto* p = dynamic_cast<const detail::PathNode*>(root_.get())) path_ = p->path_text;
}

bool Expression::compile(std::string_view text, Expression* out, ExpressionError* error) {
  try {
    std::vector<detail::PathNode> read;
    *out = Expression(detail::parse_expression(text, &read), std::string(text));
    auto distinct = std::make_shared<std::vector<detail::PathNode>>();
    for (detail::PathNode& p : read) {
      bool seen = false;
      for (const detail::PathNode& d : *distinct)
        seen = seen || d.path_text == p.path_text;
      if (!seen) distinct->push_back(std::move(p));
    }
    out->paths_ = std::move(distinct);
    return true;
  } catch (const detail::CompileError& e) {
    *error = ExpressionError{e.offset, e.message};
    return false;
  }
}

Result<Expression> Expression::compile(std::string_view text) {
  Expression out;
  ExpressionError error;
  if (!compile(text, &out, &error)) return compile_error(text, error);
  return out;
}

std::vector<std::string> Expression::field_paths() const {
  std::vector<std::string> out;
  if (paths_) {
    for (const detail::PathNode& p : *paths_)
      out.push_back(p.path_text);
  }
  return out;
}

bool Expression::has_field(size_t i, const Value& input) const {
  return paths_ && i < paths_->size() && (*paths_)[i].find(input) != nullptr;
}

Result<Value> Expression::evaluate(const Value& input) const {
  if (!root_) return runtime_error(text_, "the expression is empty (not compiled)");
  try {
    return detail::eval_owned(*root_, input);
  } catch (const detail::EvalError& e) {
    return runtime_error(text_, e.message);
  } catch (const SluiceException& e) {
    return runtime_error(text_, e.error().message());
  } catch (const std::bad_alloc&) {
    // A record error (dead letter or failure per policy), not the end of the process; sizes taken from data are
    // bounded (kMaxStringBytes), so this is a value too large for this process's memory.
    return runtime_error(text_, "out of memory while evaluating");
  } catch (const std::length_error& e) {
    return runtime_error(text_, std::string("a value is too long: ") + e.what());
  }
}

bool Expression::is_field_path() const noexcept {
  return !path_.empty();
}

const std::string& Expression::path() const noexcept {
  return path_;
}

bool Projection::compile(std::string_view text, Projection* out, ExpressionError* error) {
  try {
    std::vector<detail::ParsedItem> parsed = detail::parse_projection(text);
    Projection p;
    p.text_ = std::string(text);
    p.items_.reserve(parsed.size());
    for (detail::ParsedItem& item : parsed) {
      Item it;
      it.name = std::move(item.name);
      if (item.node) it.expr = Expression(std::move(item.node), std::move(item.text));
      p.items_.push_back(std::move(it));
    }
    *out = std::move(p);
    return true;
  } catch (const detail::CompileError& e) {
    *error = ExpressionError{e.offset, e.message};
    return false;
  }
}

Result<Projection> Projection::compile(std::string_view text) {
  Projection out;
  ExpressionError error;
  if (!compile(text, &out, &error)) return compile_error(text, error);
  return out;
}

Result<Value> Projection::evaluate(const Value& input) const {
  Value out = Value::object();
  Value::Object& fields = out.as_object();
  for (const Item& item : items_) {
    if (item.name == "*" && !item.expr.root_) {
      if (input.is_object()) {
        for (const auto& [key, value] : input.as_object())
          fields.set(key, value);
      }
      continue;
    }
    Result<Value> v = item.expr.evaluate(input);
    if (!v.ok()) return v.error().with_context("projection item '" + item.name + "'");
    fields.set(item.name, std::move(v).value());
  }
  return out;
}

std::vector<std::string> Projection::names() const {
  std::vector<std::string> out;
  out.reserve(items_.size());
  for (const Item& item : items_)
    out.push_back(item.name);
  return out;
}

}  // namespace sluice::pipeline
