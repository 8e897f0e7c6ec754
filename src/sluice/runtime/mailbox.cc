#include "sluice/runtime/mailbox.h"

#include <utility>

namespace sluice {

void Mailbox::put(Mail mail) {
  MutexLock lock(mu_);
  mails_.push_back(std::move(mail));
  has_mail_.store(true, std::memory_order_release);
}

std::deque<Mailbox::Mail> Mailbox::take_all() {
  std::deque<Mail> batch;
  MutexLock lock(mu_);
  batch.swap(mails_);
  has_mail_.store(false, std::memory_order_release);
  return batch;
}

}  // namespace sluice
