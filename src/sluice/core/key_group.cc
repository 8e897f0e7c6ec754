#include "sluice/core/key_group.h"

#include <xxhash.h>

namespace sluice {

uint64_t key_hash(std::span<const uint8_t> serialized_key) noexcept {
  return XXH3_64bits_withSeed(serialized_key.data(), serialized_key.size(), 0);
}

}  // namespace sluice
