#include "sluice/cluster/rpc/state_handle_proto.h"

#include <fmt/format.h>

#include <string>
#include <utility>

namespace sluice::rpc {

void to_proto(const OperatorSubtaskStateHandle& handle, cluster::v1::StateHandle* out) {
  out->set_path(handle.file);
  out->set_size_bytes(handle.file_size);
  out->set_subtask(handle.subtask);
  out->set_checksum(handle.checksum);
  out->set_operator_state_offset(handle.operator_state_offset);
  out->set_operator_state_length(handle.operator_state_length);
  for (const KeyGroupHandle& kg : handle.key_groups) {
    cluster::v1::KeyGroupHandle* k = out->add_key_groups();
    k->set_key_group(kg.key_group);
    k->set_offset(kg.offset);
    k->set_length(kg.length);
  }
  if (handle.native) {
    cluster::v1::NativeKeyedStateHandle* n = out->mutable_native();
    n->set_key_group_start(handle.native->key_group_start);
    n->set_key_group_end(handle.native->key_group_end);
    for (const NativeFileHandle& f : handle.native->files) {
      cluster::v1::NativeFileHandle* nf = n->add_files();
      nf->set_local_name(f.local_name);
      nf->set_shared_name(f.shared_name);
      nf->set_offset(f.offset);
      nf->set_size(f.size);
      nf->set_checksum(f.checksum);
    }
  }
}

Result<OperatorSubtaskStateHandle> from_proto(const cluster::v1::StateHandle& sh) {
  OperatorSubtaskStateHandle h;
  h.subtask = sh.subtask();
  h.file = sh.path();
  h.file_size = sh.size_bytes();
  h.checksum = sh.checksum();
  h.operator_state_offset = sh.operator_state_offset();
  h.operator_state_length = sh.operator_state_length();
  // Hidden names are refused too: the storage's own files (in-progress uploads) start with '.'.
  if (!is_plain_file_name(h.file) || h.file.starts_with('.')) {
    return Error(ErrorCode::kConfiguration,
                 fmt::format("state handle '{}' is not a file name in the checkpoint's directory", h.file));
  }
  for (const auto& kg : sh.key_groups())
    h.key_groups.push_back(KeyGroupHandle{kg.key_group(), kg.offset(), kg.length()});
  if (sh.has_native()) {
    NativeKeyedStateHandle n;
    n.key_group_start = sh.native().key_group_start();
    n.key_group_end = sh.native().key_group_end();
    for (const auto& f : sh.native().files()) {
      if (!is_plain_file_name(f.local_name()) || (!f.shared_name().empty() && !is_plain_file_name(f.shared_name()))) {
        return Error(ErrorCode::kConfiguration,
                     fmt::format("state handle '{}': native file '{}' / shared file '{}' is not a plain file name",
                                 h.file, f.local_name(), f.shared_name()));
      }
      n.files.push_back(NativeFileHandle{f.local_name(), f.shared_name(), f.offset(), f.size(), f.checksum()});
    }
    h.native = std::move(n);
  }
  return h;
}

}  // namespace sluice::rpc
