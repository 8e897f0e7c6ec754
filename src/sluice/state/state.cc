// The untyped parts of keyed state: TTL validation, kind names, error messages and snapshot framing.
#include "sluice/state/state.h"

#include <string>

#include "sluice/state/heap_keyed_state_backend.h"
#include "sluice/state/heap_state.h"

namespace sluice {

Status StateTtlConfig::validate(std::string_view state_name) const {
  if (ttl_ms < 0) {
    return Error(ErrorCode::kConfiguration, "state '" + std::string(state_name) + "': TTL of " +
                                                std::to_string(ttl_ms) +
                                                " ms is negative; use a positive TTL or 0 to disable TTL");
  }
  if (cleanup_incrementally && incremental_cleanup_size < 0) {
    return Error(ErrorCode::kConfiguration, "state '" + std::string(state_name) + "': incremental_cleanup_size " +
                                                std::to_string(incremental_cleanup_size) +
                                                " is negative; use a positive size or disable incremental cleanup");
  }
  return ok_status();
}

std::string_view state_kind_name(StateKind kind) noexcept {
  switch (kind) {
    case StateKind::kValue:
      return "value";
    case StateKind::kList:
      return "list";
    case StateKind::kMap:
      return "map";
    case StateKind::kReducing:
      return "reducing";
    case StateKind::kAggregating:
      return "aggregating";
  }
  return "unknown";
}

namespace detail {

void throw_state_error(std::string message) {
  throw SluiceException(Error(ErrorCode::kState, std::move(message)));
}

void throw_no_current_key(std::string_view state_name) {
  throw_state_error("state '" + std::string(state_name) +
                    "' was accessed with no current key: keyed state can only be used while a keyed record or "
                    "timer is processed (set_current_key first)");
}

void throw_key_outside_range(KeyGroup kg, const KeyGroupRange& range, int max_parallelism) {
  throw_state_error("key group " + std::to_string(kg.value) + " of the key is outside this subtask's key-group range " +
                    range.to_string() + " (max parallelism " + std::to_string(max_parallelism) +
                    "): the record or timer reached the wrong subtask, a partitioning bug (is the key's "
                    "serialized form deterministic, and is the key computed the same way on both sides?)");
}

void throw_entry_in_wrong_key_group(std::string_view what, KeyGroup found, KeyGroup expected, int max_parallelism) {
  throw_state_error(std::string(what) + " has a key of key group " + std::to_string(found.value) +
                    " but was stored under key group " + std::to_string(expected.value) + " (max parallelism " +
                    std::to_string(max_parallelism) +
                    "): the snapshot was taken with another max parallelism or key serializer, or is corrupt");
}

Status check_restored_state(std::string_view name, StateKind restored_kind, uint8_t restored_flags,
                            StateKind registered_kind, uint8_t registered_flags) {
  if (restored_kind != registered_kind) {
    return Error(ErrorCode::kState, "state '" + std::string(name) + "' was snapshotted as a " +
                                        std::string(state_kind_name(restored_kind)) + " state but is registered as a " +
                                        std::string(state_kind_name(registered_kind)) +
                                        " state; a state cannot change its kind between runs: keep the old "
                                        "descriptor or register the new state under a new name");
  }
  bool restored_ttl = (restored_flags & kStateFlagTtl) != 0;
  bool registered_ttl = (registered_flags & kStateFlagTtl) != 0;
  if (restored_ttl != registered_ttl) {
    return Error(ErrorCode::kState, "state '" + std::string(name) + "' was snapshotted " +
                                        (restored_ttl ? "with" : "without") + " TTL but its descriptor now " +
                                        (registered_ttl ? "enables" : "disables") +
                                        " TTL; as in Flink, TTL cannot be switched on or off for existing state: "
                                        "keep the old setting or use a new state name");
  }
  return ok_status();
}

void check_backend_range(const KeyGroupRange& range, int max_parallelism) {
  if (max_parallelism < 1 || max_parallelism > kUpperBoundMaxParallelism || range.size() == 0 || range.start() < 0 ||
      range.end() >= max_parallelism) {
    throw SluiceException(Error(ErrorCode::kConfiguration,
                                "a keyed state backend needs a non-empty key-group range inside [0, max parallelism) "
                                "and 1 <= max parallelism <= " +
                                    std::to_string(kUpperBoundMaxParallelism) + "; got range " + range.to_string() +
                                    " and max parallelism " + std::to_string(max_parallelism)));
  }
}

void check_descriptor(std::string_view name, const StateTtlConfig& ttl, bool has_function) {
  if (name.empty()) {
    throw SluiceException(Error(ErrorCode::kConfiguration, "a state descriptor needs a non-empty name"));
  }
  if (!has_function) {
    throw SluiceException(
        Error(ErrorCode::kConfiguration,
              "state '" + std::string(name) + "': the descriptor has no reduce or aggregate function; set one"));
  }
  ttl.validate(name).value_or_throw();
}

void throw_state_type_mismatch(std::string_view name, StateKind registered, StateKind requested, bool same_kind) {
  if (!same_kind) {
    throw_state_error("state '" + std::string(name) + "' is registered as a " +
                      std::string(state_kind_name(registered)) + " state and cannot also be used as a " +
                      std::string(state_kind_name(requested)) + " state; give each state its own name");
  }
  throw_state_error("state '" + std::string(name) + "' is registered as a " + std::string(state_kind_name(registered)) +
                    " state with other value or namespace types; give each state its own name");
}

size_t begin_state_section(DataOutput& out, std::string_view name, StateKind kind, uint8_t flags, uint64_t count) {
  out.write_string(name);
  out.write_u8(static_cast<uint8_t>(kind));
  out.write_u8(flags);
  out.write_varint(count);
  size_t length_at = out.size();
  out.write_fixed<uint64_t>(0);
  return length_at;
}

void end_length_prefixed(DataOutput& out, size_t length_offset) {
  uint64_t length = out.size() - length_offset - sizeof(uint64_t);
  out.write_at(length_offset, &length, sizeof(length));
}

StateKind read_state_kind(DataInput& in) {
  uint8_t b = in.read_u8();
  if (b < static_cast<uint8_t>(StateKind::kValue) || b > static_cast<uint8_t>(StateKind::kAggregating)) {
    in.fail("unknown state kind " + std::to_string(b));
  }
  return static_cast<StateKind>(b);
}

}  // namespace detail
}  // namespace sluice
