// Operator state snapshots, restore and redistribution (Flink's RoundRobinOperatorStateRepartitioner).
#include "sluice/state/operator_state.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace sluice {

namespace {

constexpr char kOperatorStateMagic[4] = {'S', 'L', 'O', 'S'};
constexpr uint64_t kOperatorStateFormatVersion = 1;

// One state of one parsed snapshot: mode and the encoded elements (each a varint length + bytes).
struct ParsedState {
  OperatorStateMode mode = OperatorStateMode::kSplitDistribute;
  std::vector<std::string_view> elements;  // the bytes of each element, without its length prefix
};

OperatorStateMode read_mode(DataInput& in) {
  uint8_t b = in.read_u8();
  if (b > static_cast<uint8_t>(OperatorStateMode::kUnion)) in.fail("unknown operator state mode " + std::to_string(b));
  return static_cast<OperatorStateMode>(b);
}

void read_header(DataInput& in) {
  char magic[4];
  in.read_bytes(magic, sizeof(magic));
  if (std::memcmp(magic, kOperatorStateMagic, sizeof(magic)) != 0)
    in.fail("not an operator state snapshot (bad magic)");
  uint64_t version = in.read_varint();
  if (version != kOperatorStateFormatVersion) {
    in.fail("unsupported operator state format version " + std::to_string(version) + " (this build reads version " +
            std::to_string(kOperatorStateFormatVersion) + ")");
  }
}

void write_header(DataOutput& out, uint64_t num_states) {
  out.write_bytes(kOperatorStateMagic, sizeof(kOperatorStateMagic));
  out.write_varint(kOperatorStateFormatVersion);
  out.write_varint(num_states);
}

// Calls fn(name, mode, count, element_bytes) for each state of a snapshot, where element_bytes holds the
// `count` length-prefixed elements. An empty snapshot has no states.
template <class Fn>
void for_each_state(std::string_view snapshot, Fn&& fn) {
  if (snapshot.empty()) return;
  DataInput in(snapshot);
  read_header(in);
  uint64_t num_states = in.read_varint();
  std::string name;
  for (uint64_t i = 0; i < num_states; ++i) {
    in.read_string(name);
    OperatorStateMode mode = read_mode(in);
    uint64_t count = in.read_varint();
    size_t start = in.position();
    for (uint64_t e = 0; e < count; ++e)
      in.skip(in.read_length());
    fn(name, mode, count, snapshot.substr(start, in.position() - start));
  }
  if (!in.at_end()) in.fail("trailing bytes after the last operator state");
}

Error mode_conflict(std::string_view name, OperatorStateMode a, OperatorStateMode b) {
  return Error(ErrorCode::kState, "operator state '" + std::string(name) + "' is a " +
                                      std::string(operator_state_mode_name(a)) + " state in one snapshot and a " +
                                      std::string(operator_state_mode_name(b)) + " state in another");
}

}  // namespace

std::string_view operator_state_mode_name(OperatorStateMode mode) noexcept {
  switch (mode) {
    case OperatorStateMode::kSplitDistribute:
      return "list";
    case OperatorStateMode::kUnion:
      return "union list";
  }
  return "unknown";
}

namespace detail {

void throw_operator_state_mismatch(std::string_view name, OperatorStateMode registered, OperatorStateMode requested,
                                   bool same_mode) {
  std::string message = "operator state '" + std::string(name) + "' ";
  if (same_mode) {
    message += "is registered with another element type; give each state its own name";
  } else {
    message += "is a " + std::string(operator_state_mode_name(registered)) +
               " state (registered or restored) and cannot be used as a " +
               std::string(operator_state_mode_name(requested)) +
               " state; keep the mode or register the state under a new name";
  }
  throw SluiceException(Error(ErrorCode::kState, std::move(message)));
}

}  // namespace detail

std::vector<std::string> OperatorStateStore::state_names() const {
  std::vector<std::string> names;
  for (const auto& [name, s] : states_)
    names.push_back(name);
  for (const auto& [name, p] : pending_)
    names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

void OperatorStateStore::snapshot(DataOutput& out) const {
  // Registered and pending names are disjoint; write them merged in name order.
  write_header(out, states_.size() + pending_.size());
  auto s = states_.begin();
  auto p = pending_.begin();
  while (s != states_.end() || p != pending_.end()) {
    if (p == pending_.end() || (s != states_.end() && s->first < p->first)) {
      out.write_string(s->first);
      out.write_u8(static_cast<uint8_t>(s->second->mode()));
      s->second->write_elements(out);
      ++s;
    } else {
      out.write_string(p->first);
      out.write_u8(static_cast<uint8_t>(p->second.mode));
      out.write_varint(p->second.count);
      out.write_bytes(p->second.bytes.data(), p->second.bytes.size());
      ++p;
    }
  }
}

Status OperatorStateStore::restore(DataInput& in) {
  try {
    std::string_view bytes(reinterpret_cast<const char*>(in.current()), in.remaining());
    Status status = ok_status();
    for_each_state(bytes,
                   [&](const std::string& name, OperatorStateMode mode, uint64_t count, std::string_view elements) {
                     if (!status.ok()) return;
                     if (auto it = states_.find(name); it != states_.end()) {
                       if (it->second->mode() != mode) {
                         status = mode_conflict(name, mode, it->second->mode());
                         return;
                       }
                       DataInput element_in(elements);
                       it->second->read_elements(count, element_in);
                       return;
                     }
                     auto [it, inserted] = pending_.try_emplace(name);
                     if (inserted) {
                       it->second.mode = mode;
                     } else if (it->second.mode != mode) {
                       status = mode_conflict(name, mode, it->second.mode);
                       return;
                     }
                     it->second.count += count;
                     it->second.bytes.append(elements);
                   });
    in.skip(in.remaining());
    return status;
  } catch (const SluiceException& e) {
    return e.error().with_context("restoring operator state");
  }
}

Status OperatorStateStore::redistribute(std::span<const std::string_view> old_snapshots, int new_parallelism,
                                        int subtask_index, DataOutput& out) {
  if (new_parallelism < 1 || subtask_index < 0 || subtask_index >= new_parallelism) {
    return Error(ErrorCode::kConfiguration, "redistributing operator state: subtask index " +
                                                std::to_string(subtask_index) + " is not in [0, " +
                                                std::to_string(new_parallelism) + ")");
  }
  // name -> mode and the elements of every old subtask, concatenated in subtask order; plus, for an
  // unchanged parallelism, the elements of the old subtask with the same index.
  struct Collected {
    OperatorStateMode mode;
    std::vector<std::string_view> all;
    std::vector<std::string_view> same_index;
  };
  std::map<std::string, Collected, std::less<>> states;
  const bool same_parallelism = static_cast<size_t>(new_parallelism) == old_snapshots.size();
  try {
    for (size_t old = 0; old < old_snapshots.size(); ++old) {
      Status status = ok_status();
      for_each_state(old_snapshots[old],
                     [&](const std::string& name, OperatorStateMode mode, uint64_t count, std::string_view elements) {
                       auto [it, inserted] = states.try_emplace(name, Collected{mode, {}, {}});
                       if (!inserted && it->second.mode != mode) {
                         if (status.ok()) status = mode_conflict(name, it->second.mode, mode);
                         return;
                       }
                       DataInput in(elements);
                       for (uint64_t e = 0; e < count; ++e) {
                         std::string_view element = in.read_view(in.read_length());
                         it->second.all.push_back(element);
                         if (same_parallelism && old == static_cast<size_t>(subtask_index))
                           it->second.same_index.push_back(element);
                       }
                     });
      SLUICE_RETURN_IF_ERROR(status);
    }
  } catch (const SluiceException& e) {
    return e.error().with_context("redistributing operator state");
  }

  write_header(out, states.size());
  int start = 0;  // Flink's startParallelOp: where the runs with an extra element begin for the next state
  for (const auto& [name, c] : states) {
    std::span<const std::string_view> mine;
    if (c.mode == OperatorStateMode::kUnion) {
      mine = c.all;
    } else if (same_parallelism) {
      mine = c.same_index;
    } else {
      const size_t total = c.all.size();
      const size_t base = total / static_cast<size_t>(new_parallelism);
      int64_t remainder = static_cast<int64_t>(total % static_cast<size_t>(new_parallelism));
      int new_start = start;
      size_t offset = 0;
      for (int i = 0; i < new_parallelism; ++i) {
        int op = (i + start) % new_parallelism;
        size_t n = base;
        if (remainder > 0) {
          ++n;
          --remainder;
        } else if (remainder == 0) {
          new_start = op;
          --remainder;
        }
        if (op == subtask_index) mine = std::span<const std::string_view>(c.all).subspan(offset, n);
        offset += n;
      }
      start = new_start;
    }
    out.write_string(name);
    out.write_u8(static_cast<uint8_t>(c.mode));
    out.write_varint(mine.size());
    for (std::string_view element : mine)
      out.write_string(element);
  }
  return ok_status();
}

}  // namespace sluice
