// Private to src/sluice/connectors/mongodb/: the split enumerator of MongoCdcSource (mongodb_cdc_enumerator.cc):
// collection discovery at start and every discovery interval, the owner rule, checkpoint markers (see the file
// comment of mongodb_cdc_source.h). Its methods run serialized under the source coordinator's lock.
#pragma once

#include <memory>

#include "sluice/api/source.h"
#include "sluice/connectors/mongodb/mongodb_cdc_source.h"

namespace sluice {
namespace mongodb_cdc_internal {

/// The enumerator of a MongoCdcSource with `settings`, talking to the server through `driver`.
std::unique_ptr<SplitEnumerator<MongoCollectionSplit>> make_mongo_cdc_enumerator(
    SplitEnumeratorContext<MongoCollectionSplit>& ctx, const detail::MongoCdcSourceSettings& settings,
    std::unique_ptr<mongodb::MongoDriver> driver);

}  // namespace mongodb_cdc_internal
}  // namespace sluice
