#include "sluice/checkpoint/checkpoint_metadata.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <cstring>
#include <limits>

#include "sluice/core/data_io.h"

namespace sluice {
namespace {

constexpr char kMagic[4] = {'S', 'L', 'C', 'M'};

Error metadata_error(std::string_view file, const std::string& what) {
  return Error(ErrorCode::kState, fmt::format("checkpoint metadata file {}: {}", file, what));
}

// Reads a varint that must fit an int in [0, limit].
int read_int(DataInput& in, const char* what, uint64_t limit) {
  uint64_t v = in.read_varint();
  if (v > limit) in.fail(fmt::format("{} {} is larger than {}", what, v, limit));
  return static_cast<int>(v);
}

Status check_subtask(std::string_view file, const OperatorStateEntry& op, const OperatorSubtaskStateHandle& h) {
  auto fail = [&](const std::string& what) {
    return metadata_error(file, fmt::format("operator '{}' subtask {} (file {}): {}", op.uid, h.subtask, h.file, what));
  };
  if (h.subtask < 0 || h.subtask >= op.parallelism)
    return fail(fmt::format("subtask index not in [0, {})", op.parallelism));
  if (!is_plain_file_name(h.file)) return fail("the file name is not a plain file name");
  auto in_file = [&](uint64_t offset, uint64_t length) {
    return offset <= h.file_size && length <= h.file_size - offset;
  };
  if (!in_file(h.operator_state_offset, h.operator_state_length))
    return fail(fmt::format("operator state [{}, +{}) lies outside the file of {} bytes", h.operator_state_offset,
                            h.operator_state_length, h.file_size));
  int32_t previous = -1;
  for (const KeyGroupHandle& kg : h.key_groups) {
    if (kg.key_group < 0 || kg.key_group >= op.max_parallelism)
      return fail(fmt::format("key group {} not in [0, {})", kg.key_group, op.max_parallelism));
    if (kg.key_group <= previous) return fail(fmt::format("key group {} out of order", kg.key_group));
    if (kg.length == 0) return fail(fmt::format("key group {} has length 0", kg.key_group));
    if (!in_file(kg.offset, kg.length))
      return fail(fmt::format("key group {} [{}, +{}) lies outside the file of {} bytes", kg.key_group, kg.offset,
                              kg.length, h.file_size));
    previous = kg.key_group;
  }
  if (h.native) {
    const NativeKeyedStateHandle& n = *h.native;
    if (n.key_group_start < 0 || n.key_group_end >= op.max_parallelism || n.key_group_start > n.key_group_end)
      return fail(fmt::format("native key groups [{}, {}] not within [0, {})", n.key_group_start, n.key_group_end,
                              op.max_parallelism));
    for (const NativeFileHandle& f : n.files) {
      if (!is_plain_file_name(f.local_name))
        return fail(fmt::format("native file '{}' is not a plain file name", f.local_name));
      if (!f.shared_name.empty() && !is_plain_file_name(f.shared_name))
        return fail(fmt::format("shared file '{}' is not a plain file name", f.shared_name));
      if (f.shared_name.empty() && !in_file(f.offset, f.size))
        return fail(fmt::format("native file {} [{}, +{}) lies outside the file of {} bytes", f.local_name, f.offset,
                                f.size, h.file_size));
    }
  }
  return ok_status();
}

}  // namespace

std::map<std::string, uint64_t> shared_files_of(const CheckpointMetadata& metadata) {
  std::map<std::string, uint64_t> files;
  for (const OperatorStateEntry& op : metadata.operators) {
    for (const OperatorSubtaskStateHandle& h : op.subtasks) {
      if (!h.native) continue;
      for (const NativeFileHandle& f : h.native->files)
        if (!f.shared_name.empty()) files.emplace(f.shared_name, f.size);
    }
  }
  return files;
}

std::string serialize_checkpoint_metadata(const CheckpointMetadata& m) {
  DataOutput out;
  out.write_bytes(kMagic, sizeof(kMagic));
  out.write_varint(kCheckpointMetadataVersion);
  out.write_fixed<int64_t>(m.checkpoint_id);
  out.write_fixed<int64_t>(m.trigger_timestamp);
  out.write_u8(static_cast<uint8_t>(m.type));
  out.write_string(m.job_id);
  out.write_fixed<uint64_t>(m.total_state_bytes);
  out.write_varint(m.operators.size());
  for (const OperatorStateEntry& op : m.operators) {
    out.write_string(op.uid);
    out.write_varint(static_cast<uint64_t>(op.parallelism));
    out.write_varint(static_cast<uint64_t>(op.max_parallelism));
    out.write_varint(op.subtasks.size());
    for (const OperatorSubtaskStateHandle& h : op.subtasks) {
      out.write_varint(static_cast<uint64_t>(h.subtask));
      out.write_string(h.file);
      out.write_fixed<uint64_t>(h.file_size);
      out.write_fixed<uint64_t>(h.checksum);
      out.write_fixed<uint64_t>(h.operator_state_offset);
      out.write_fixed<uint64_t>(h.operator_state_length);
      out.write_varint(h.key_groups.size());
      for (const KeyGroupHandle& kg : h.key_groups) {
        out.write_varint(static_cast<uint64_t>(kg.key_group));
        out.write_fixed<uint64_t>(kg.offset);
        out.write_fixed<uint64_t>(kg.length);
      }
      out.write_u8(h.native ? 1 : 0);
      if (h.native) {
        out.write_varint(static_cast<uint64_t>(h.native->key_group_start));
        out.write_varint(static_cast<uint64_t>(h.native->key_group_end));
        out.write_varint(h.native->files.size());
        for (const NativeFileHandle& f : h.native->files) {
          out.write_string(f.local_name);
          out.write_string(f.shared_name);
          out.write_fixed<uint64_t>(f.offset);
          out.write_fixed<uint64_t>(f.size);
          out.write_fixed<uint64_t>(f.checksum);
        }
      }
      out.write_string(h.location);
    }
  }
  out.write_varint(m.coordinator_state.size());
  for (const auto& [uid, bytes] : m.coordinator_state) {
    out.write_string(uid);
    out.write_string(bytes);
  }
  out.write_fixed<uint64_t>(XXH3_64bits(out.data(), out.size()));
  return std::string(out.view());
}

Result<CheckpointMetadata> deserialize_checkpoint_metadata(std::string_view bytes, std::string_view file) {
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    return metadata_error(file, "not a Sluice checkpoint metadata file (magic \"SLCM\" missing)");
  if (bytes.size() < sizeof(kMagic) + 1 + sizeof(uint64_t))
    return metadata_error(file, fmt::format("truncated: only {} bytes", bytes.size()));
  // The version comes before the checksum check so that a file of a newer Sluice gets a clear message.
  CheckpointMetadata m;
  try {
    DataInput header(bytes.substr(sizeof(kMagic)));
    uint64_t version = header.read_varint();
    if (version < 1 || version > kCheckpointMetadataVersion)
      return metadata_error(file, fmt::format("format version {} is not supported (this Sluice reads versions 1 "
                                              "to {})",
                                              version, kCheckpointMetadataVersion));
    const std::string_view body = bytes.substr(0, bytes.size() - sizeof(uint64_t));
    uint64_t expected;
    std::memcpy(&expected, bytes.data() + body.size(), sizeof(expected));
    uint64_t actual = XXH3_64bits(body.data(), body.size());
    if (expected != actual)
      return metadata_error(file, fmt::format("checksum mismatch: the file records {:016x}, its bytes hash to "
                                              "{:016x} (the file is corrupted or truncated)",
                                              expected, actual));

    DataInput in(body);
    in.skip(sizeof(kMagic));
    const uint64_t read_version = in.read_varint();
    m.checkpoint_id = in.read_fixed<int64_t>();
    m.trigger_timestamp = in.read_fixed<int64_t>();
    uint8_t type = in.read_u8();
    if (type > static_cast<uint8_t>(SnapshotType::kSavepointTerminate))
      in.fail(fmt::format("unknown snapshot type {}", type));
    m.type = static_cast<SnapshotType>(type);
    in.read_string(m.job_id);
    m.total_state_bytes = in.read_fixed<uint64_t>();
    constexpr uint64_t kMaxInt = std::numeric_limits<int32_t>::max();
    const uint64_t op_count = in.read_varint();
    for (uint64_t i = 0; i < op_count; ++i) {
      OperatorStateEntry& op = m.operators.emplace_back();
      in.read_string(op.uid);
      op.parallelism = read_int(in, "parallelism", kMaxInt);
      op.max_parallelism = read_int(in, "max parallelism", kMaxInt);
      const uint64_t subtask_count = in.read_varint();
      for (uint64_t s = 0; s < subtask_count; ++s) {
        OperatorSubtaskStateHandle& h = op.subtasks.emplace_back();
        h.subtask = read_int(in, "subtask index", kMaxInt);
        in.read_string(h.file);
        h.file_size = in.read_fixed<uint64_t>();
        h.checksum = in.read_fixed<uint64_t>();
        h.operator_state_offset = in.read_fixed<uint64_t>();
        h.operator_state_length = in.read_fixed<uint64_t>();
        const uint64_t kg_count = in.read_varint();
        for (uint64_t k = 0; k < kg_count; ++k) {
          KeyGroupHandle& kg = h.key_groups.emplace_back();
          kg.key_group = read_int(in, "key group", kMaxInt);
          kg.offset = in.read_fixed<uint64_t>();
          kg.length = in.read_fixed<uint64_t>();
        }
        if (read_version >= 2 && in.read_u8() != 0) {
          NativeKeyedStateHandle& n = h.native.emplace();
          n.key_group_start = read_int(in, "key group", kMaxInt);
          n.key_group_end = read_int(in, "key group", kMaxInt);
          const uint64_t file_count = in.read_varint();
          for (uint64_t f = 0; f < file_count; ++f) {
            NativeFileHandle& nf = n.files.emplace_back();
            in.read_string(nf.local_name);
            in.read_string(nf.shared_name);
            nf.offset = in.read_fixed<uint64_t>();
            nf.size = in.read_fixed<uint64_t>();
            nf.checksum = in.read_fixed<uint64_t>();
          }
        }
        if (read_version >= 3) in.read_string(h.location);
        SLUICE_RETURN_IF_ERROR(check_subtask(file, op, h));
      }
    }
    const uint64_t coordinator_count = in.read_varint();
    for (uint64_t i = 0; i < coordinator_count; ++i) {
      std::string uid;
      std::string state;
      in.read_string(uid);
      in.read_string(state);
      m.coordinator_state.emplace(std::move(uid), std::move(state));
    }
    if (!in.at_end())
      return metadata_error(file, fmt::format("{} unexpected bytes after the last field", in.remaining()));
  } catch (const SluiceException& e) {
    return metadata_error(file, e.error().message());
  }
  return m;
}

}  // namespace sluice
