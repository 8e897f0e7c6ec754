// Private to src/sluice/connectors/mongodb/: the reader of MongoCdcSource (mongodb_cdc_reader.cc): the snapshot scan
// and the change stream of each assigned collection split, resume positions, bad records, the connection probe.
// Runs on its task thread (the probe on a thread of its own).
#pragma once

#include <memory>

#include "sluice/api/source.h"
#include "sluice/connectors/bad_record.h"
#include "sluice/connectors/cdc/change_event.h"
#include "sluice/connectors/mongodb/mongodb_cdc_source.h"

namespace sluice {
namespace mongodb_cdc_internal {

/// A reader of a MongoCdcSource with `settings`, reading through `driver`; it reports into `metrics` and writes bad
/// records to `dead_letter` (nullptr unless the policy is kDeadLetter).
std::unique_ptr<SourceReader<cdc::ChangeEvent, MongoCollectionSplit>> make_mongo_cdc_reader(
    SourceReaderContext& ctx, const detail::MongoCdcSourceSettings& settings,
    std::unique_ptr<mongodb::MongoDriver> driver, std::shared_ptr<MongoCdcSourceMetrics> metrics,
    std::shared_ptr<DeadLetterFile> dead_letter);

}  // namespace mongodb_cdc_internal
}  // namespace sluice
