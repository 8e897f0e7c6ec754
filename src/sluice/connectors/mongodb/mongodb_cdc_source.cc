// MongoCdcSource: its enumerator and readers (mongodb_cdc_enumerator.cc, mongodb_cdc_reader.cc) and the dead-letter
// file they share. The builder is in mongodb_cdc_source_builder.cc, the metrics in mongodb_cdc_metrics.cc, the
// change mapping in mongodb_change_mapping.cc and the libmongoc driver in libmongoc_driver.cc.
#include "sluice/connectors/mongodb/mongodb_cdc_source.h"

#include <memory>
#include <mutex>

#include "mongodb_cdc_enumerator.h"
#include "mongodb_cdc_reader.h"

namespace sluice {

MongoCdcSource::MongoCdcSource(detail::MongoCdcSourceSettings settings) : settings_(std::move(settings)) {
  metrics_->connections = std::make_shared<SourceConnectionBoard>("MongoDB CDC source (" + settings_.describe() + ")");
}

std::shared_ptr<DeadLetterFile> MongoCdcSource::dead_letter_file() const {
  if (settings_.bad_record_policy != BadRecordPolicy::kDeadLetter) return nullptr;
  std::lock_guard lock(mu_);
  if (!dead_letter_) dead_letter_ = DeadLetterFile::open(settings_.dead_letter_path).value_or_throw();
  return dead_letter_;
}

std::unique_ptr<SplitEnumerator<MongoCollectionSplit>> MongoCdcSource::create_enumerator(
    SplitEnumeratorContext<MongoCollectionSplit>& ctx) const {
  dead_letter_file();
  return mongodb_cdc_internal::make_mongo_cdc_enumerator(ctx, settings_, settings_.driver_factory().value_or_throw());
}

std::unique_ptr<SourceReader<cdc::ChangeEvent, MongoCollectionSplit>> MongoCdcSource::create_reader(
    SourceReaderContext& ctx) const {
  return mongodb_cdc_internal::make_mongo_cdc_reader(ctx, settings_, settings_.driver_factory().value_or_throw(),
                                                     metrics_, dead_letter_file());
}

}  // namespace sluice
