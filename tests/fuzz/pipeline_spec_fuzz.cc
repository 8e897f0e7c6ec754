// The pipeline file parser (`sluice validate` / `sluice run`, pipeline_spec.h): any text gives a PipelineSpec
// or a kConfiguration error naming the place, never a crash or a hang (yaml-cpp, then the option tables and
// the expressions of the transforms).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.h"
#include "sluice/pipeline/pipeline_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  sluice::Result<sluice::pipeline::PipelineSpec> spec = sluice::pipeline::parse_pipeline(text, "fuzz.yaml");
  (void)spec;
  return 0;
}
