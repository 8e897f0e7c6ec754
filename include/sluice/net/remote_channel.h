// The two ends of a channel whose producer and consumer run on different TaskManagers. They implement the
// runtime's ChannelSender / ChannelReceiver, so a task cannot tell them from a LocalChannel: a RecordWriter
// fills the sender's buffers and a StreamInputProcessor reads the receiver's, unchanged.
//
// Flow control is credit-based (Flink's FLINK-7282): the receiver grants credit (free buffers) per channel;
// the connection's I/O thread writes a queued buffer only against credit, with the sender's backlog, so the
// receiver can add floating buffers. Events (barriers, watermarks, end of partition) are elements inside the
// buffers, so they stay in order with the channel's records.
//
// Failure: when the connection to the peer is lost, or the peer reports the channel failed (an unknown or
// stale channel id, the receiver released it), both ends throw SluiceException (kNetwork) naming the peer
// from try_acquire() / poll() (poll() first hands out the buffers received before the failure), after
// notifying the task's wakeup so a waiting task sees it at once.
//
// Wakeups: the connection's I/O thread notifies the WakeupSignal set on a channel at any time (credit
// returned, data arrived, failure). The signal must outlive the channel, or be cleared with
// set_*_wakeup(nullptr) before it is destroyed: after that call returns no notification of it is in flight.
#pragma once

#include <cstdint>
#include <memory>

#include "sluice/net/wire_format.h"
#include "sluice/runtime/channel.h"

namespace sluice::net {

namespace detail {
struct OutputChannelState;
struct InputChannelState;
}  // namespace detail

/// The producer's end. try_acquire/send/set_sender_wakeup: the producing task's thread; stats(): any thread.
/// Created by ConnectionManager::create_output_channel; destroying it releases the channel.
class RemoteChannelSender final : public ChannelSender {
 public:
  explicit RemoteChannelSender(std::shared_ptr<detail::OutputChannelState> state);
  ~RemoteChannelSender() override;
  RemoteChannelSender(const RemoteChannelSender&) = delete;
  RemoteChannelSender& operator=(const RemoteChannelSender&) = delete;

  /// An empty buffer of this channel's own pool share, or nullptr when all are queued or being written.
  /// Throws SluiceException (kNetwork) when the channel failed.
  NetworkBuffer* try_acquire() override;
  /// Queues a filled buffer for the connection's I/O thread, which writes it once the receiver granted credit.
  void send(NetworkBuffer* buffer) override;
  void set_sender_wakeup(WakeupSignal* signal) override;

  struct Stats {
    int64_t credit_received = 0;  ///< credit the receiver announced in total
    int64_t buffers_sent = 0;     ///< buffers written to the socket in total (never above credit_received)
    int64_t queued = 0;           ///< buffers filled and waiting for credit or for the socket
    int64_t buffers = 0;          ///< the channel's own buffers
  };
  Stats stats() const;
  const ChannelId& id() const;

 private:
  std::shared_ptr<detail::OutputChannelState> state_;
};

/// The consumer's end. poll/recycle/set_receiver_wakeup: the consuming task's thread; stats(): any thread.
/// Created by ConnectionManager::create_input_channel; destroying it releases the channel (the sender is told).
class RemoteInputChannel final : public ChannelReceiver {
 public:
  explicit RemoteInputChannel(std::shared_ptr<detail::InputChannelState> state);
  ~RemoteInputChannel() override;
  RemoteInputChannel(const RemoteInputChannel&) = delete;
  RemoteInputChannel& operator=(const RemoteInputChannel&) = delete;

  /// The next received buffer, or nullptr. Throws SluiceException (kNetwork) when the channel failed and
  /// every buffer received before the failure was handed out.
  NetworkBuffer* poll() override;
  /// Gives a read buffer back: it becomes credit again (or goes back to the gate's floating buffers).
  void recycle(NetworkBuffer* buffer) override;
  void set_receiver_wakeup(WakeupSignal* signal) override;

  struct Stats {
    int64_t credit_announced = 0;  ///< credit sent to the producer in total
    int64_t buffers_received = 0;  ///< never above credit_announced (a sender that passes it is a protocol error)
    int64_t held = 0;              ///< received and not yet recycled
    int64_t peak_held = 0;         ///< the largest `held` seen
    int64_t exclusive = 0;         ///< the channel's exclusive buffers
    int64_t floating = 0;          ///< floating buffers assigned to the channel now
  };
  Stats stats() const;
  const ChannelId& id() const;

 private:
  std::shared_ptr<detail::InputChannelState> state_;
};

}  // namespace sluice::net
