// S3Client: the S3 REST calls checkpoint storage needs (objects, listing, multipart uploads) against AWS S3 or an
// S3-compatible store, over libcurl, signed with AWS Signature Version 4 (CURLOPT_AWS_SIGV4; the payload's
// SHA-256 in x-amz-content-sha256 and its MD5 in Content-MD5, so the store refuses a body altered in transit).
//
// Addressing: virtual-hosted (https://<bucket>.s3.<region>.amazonaws.com/<key>) by default, path-style
// (<endpoint>/<bucket>/<key>) with s3.path-style-access, which a custom s3.endpoint usually needs.
// Retries: a request that times out, cannot connect, or gets a 5xx/429 answer is retried up to s3.max-attempts
// times in all with exponential backoff (s3.retry.initial-backoff doubling up to s3.retry.max-backoff, with
// jitter); a 4xx answer is not retried. Errors name the method, bucket/key, HTTP status and S3's error code and
// message, never the credentials.
// Credentials (first found): s3.access-key + s3.secret-key; AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+
// AWS_SESSION_TOKEN); the shared credentials file (s3.credentials-file, AWS_SHARED_CREDENTIALS_FILE or
// ~/.aws/credentials; profile AWS_PROFILE or "default"). Nothing is logged of them.
// Thread-safety: every member function may be called from several threads at once (one curl handle per thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/config.h"
#include "sluice/core/error.h"

namespace sluice {

namespace options {
inline const ConfigOption<std::string> kS3Endpoint{
    "s3.endpoint", "",
    "Endpoint of an S3-compatible store (http://host:port); empty: AWS (AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL "
    "when set)."};
inline const ConfigOption<bool> kS3PathStyleAccess{
    "s3.path-style-access", false,
    "Address buckets as <endpoint>/<bucket>/<key> instead of <bucket>.<endpoint>/<key>; most S3-compatible stores "
    "need it."};
inline const ConfigOption<std::string> kS3Region{"s3.region", "",
                                                 "Region the requests are signed for; empty: AWS_REGION, else "
                                                 "us-east-1."};
inline const ConfigOption<std::string> kS3AccessKey{"s3.access-key", "",
                                                    "Access key id; empty: AWS_ACCESS_KEY_ID or the credentials file."};
inline const ConfigOption<std::string> kS3SecretKey{"s3.secret-key", "",
                                                    "Secret access key (with s3.access-key); never logged."};
inline const ConfigOption<std::string> kS3CredentialsFile{
    "s3.credentials-file", "",
    "AWS shared credentials file (INI, [profile] aws_access_key_id / aws_secret_access_key / aws_session_token); "
    "empty: AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials."};
inline const ConfigOption<int64_t> kS3MultipartThreshold{
    "s3.multipart.threshold", 64LL << 20,
    "A state file larger than this is uploaded in parts (multipart upload) instead of one PUT.", OptionUnit::kMemory};
inline const ConfigOption<int64_t> kS3MultipartPartSize{
    "s3.multipart.part-size", 16LL << 20, "Size of each part of a multipart upload (S3's minimum is 5 MiB).",
    OptionUnit::kMemory};
inline const ConfigOption<int32_t> kS3MaxAttempts{
    "s3.max-attempts", 5, "Attempts of one request (1 = no retry) on timeouts, connection failures, 5xx and 429."};
inline const ConfigOption<int64_t> kS3RetryInitialBackoff{
    "s3.retry.initial-backoff", 100, "Wait before the first retry; doubled for each next one.", OptionUnit::kDuration};
inline const ConfigOption<int64_t> kS3RetryMaxBackoff{"s3.retry.max-backoff", 5000, "Longest wait between retries.",
                                                      OptionUnit::kDuration};
inline const ConfigOption<int64_t> kS3RequestTimeout{"s3.request-timeout", 60'000,
                                                     "Longest time of one request attempt (connect, send, receive).",
                                                     OptionUnit::kDuration};
inline const ConfigOption<int64_t> kS3ConnectTimeout{"s3.connect-timeout", 5'000,
                                                     "Longest time to connect to the store.", OptionUnit::kDuration};
}  // namespace options

/// True for "s3://..." (also s3a:// and s3p://, Flink's Hadoop and Presto schemes).
bool is_s3_uri(std::string_view uri) noexcept;

/// "s3://bucket/key/prefix" split into bucket and key (no leading or trailing '/').
struct S3Uri {
  std::string bucket;
  std::string key;
  /// Errors: kConfiguration naming the URI when it is not s3://, has no bucket, or its key has characters
  /// other than [A-Za-z0-9/._-=+~].
  static Result<S3Uri> parse(std::string_view uri);
  std::string to_string() const;
};

/// Where and how to reach the store, and the limits of each request. Credentials are not printable.
struct S3Options {
  std::string endpoint;  ///< "" = AWS for `region`
  bool path_style = false;
  std::string region = "us-east-1";
  std::string access_key;
  std::string secret_key;
  std::string session_token;
  int64_t multipart_threshold = 64LL << 20;
  int64_t part_size = 16LL << 20;
  int max_attempts = 5;
  int64_t initial_backoff_ms = 100;
  int64_t max_backoff_ms = 5000;
  int64_t request_timeout_ms = 60'000;
  int64_t connect_timeout_ms = 5'000;

  /// The s3.* options of `config`, the AWS environment variables and the credentials file (see the file
  /// comment). Errors: kConfiguration for a bad value (part size below 5 MiB, attempts < 1, an unreadable
  /// credentials file that was named explicitly, a secret key without an access key).
  static Result<S3Options> from_config(const Configuration& config);
};

/// One object of a listing.
struct S3Object {
  std::string key;
  int64_t size = 0;
  std::string last_modified;  ///< ISO 8601 UTC as S3 lists it ("2026-12-02T19:30:00.000Z"): compares as text
  std::string etag;           ///< as listed, quotes included; a multipart object's ends in "-<parts>\""
};

/// A listing under a prefix: objects, and with a delimiter the "directories" (common prefixes, ending in it).
struct S3Listing {
  std::vector<S3Object> objects;
  std::vector<std::string> common_prefixes;
};

/// An in-progress (created, neither completed nor aborted) multipart upload of a listing.
struct S3MultipartUpload {
  std::string key;
  std::string upload_id;
  std::string initiated;  ///< ISO 8601 UTC, as S3 lists it
};

/// S3 requests (see the file comment). Every call returns kCheckpoint errors naming the request (checkpoint
/// storage was its first user; other callers, such as the files sink, wrap them in their own code).
class S3Client {
 public:
  explicit S3Client(S3Options options);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  const S3Options& options() const noexcept { return options_; }

  /// PUT of a whole object (atomic: readers see the old object, none, or all of the new one).
  [[nodiscard]] Status put_object(const std::string& bucket, const std::string& key, std::string_view bytes) const;
  /// GET of a whole object. `found` is set false (and the result empty) when it does not exist.
  [[nodiscard]] Result<std::string> get_object(const std::string& bucket, const std::string& key,
                                               bool* found = nullptr) const;
  /// GET of a whole object into the file `fd` from offset 0 (truncated first, and again before a retry): for
  /// objects too large for memory. Returns the bytes written. `found` as get_object(); an error body is not
  /// written to the file. Errors: those of get_object(), and kCheckpoint when writing the file fails (no retry).
  [[nodiscard]] Result<uint64_t> get_object_to_file(const std::string& bucket, const std::string& key, int fd,
                                                    bool* found = nullptr) const;
  /// HEAD: whether the object exists.
  [[nodiscard]] Result<bool> exists(const std::string& bucket, const std::string& key) const;
  /// HEAD: the object's key, size and ETag (quotes included), or nullopt when it does not exist.
  [[nodiscard]] Result<std::optional<S3Object>> head_object(const std::string& bucket, const std::string& key) const;
  /// Every object under `prefix` (ListObjectsV2, all pages); with `delimiter` also the common prefixes.
  [[nodiscard]] Result<S3Listing> list(const std::string& bucket, const std::string& prefix,
                                       std::string_view delimiter = {}) const;
  /// DELETE of one object (no error when it is absent).
  [[nodiscard]] Status delete_object(const std::string& bucket, const std::string& key) const;
  /// Deletes every object under `prefix`; returns how many.
  [[nodiscard]] Result<int64_t> delete_prefix(const std::string& bucket, const std::string& prefix) const;
  /// CreateBucket (no error when this account owns it already).
  [[nodiscard]] Status create_bucket(const std::string& bucket) const;

  /// Multipart upload: start, upload parts 1..n (ETag returned), complete in order, or abort.
  [[nodiscard]] Result<std::string> create_multipart_upload(const std::string& bucket, const std::string& key) const;
  [[nodiscard]] Result<std::string> upload_part(const std::string& bucket, const std::string& key,
                                                const std::string& upload_id, int part_number,
                                                std::string_view bytes) const;
  /// Completes the upload with parts 1..etags.size(). `no_such_upload`, when given, is set true when S3 answers
  /// 404 NoSuchUpload (the upload was completed or aborted before, or never existed); the result is then an error.
  [[nodiscard]] Status complete_multipart_upload(const std::string& bucket, const std::string& key,
                                                 const std::string& upload_id, const std::vector<std::string>& etags,
                                                 bool* no_such_upload = nullptr) const;
  /// Aborts the upload (no error when it is gone already).
  [[nodiscard]] Status abort_multipart_upload(const std::string& bucket, const std::string& key,
                                              const std::string& upload_id) const;
  /// The in-progress multipart uploads of keys under `prefix` (ListMultipartUploads, all pages).
  [[nodiscard]] Result<std::vector<S3MultipartUpload>> list_multipart_uploads(const std::string& bucket,
                                                                              const std::string& prefix) const;
  /// The ETag S3 gives an object completed from parts with these ETags: the hex MD5 of the parts' binary MD5s,
  /// then "-<number of parts>", in quotes. Lets a caller tell its own completed upload from another object.
  static std::string multipart_etag(const std::vector<std::string>& part_etags);

  /// The process-wide client (Flink's FileSystem.initialize: one configuration per process). configure()
  /// replaces it for later calls of shared(); shared() before any configure() uses the environment only.
  /// Errors of shared(): those of S3Options::from_config.
  static Status configure(const Configuration& config);
  [[nodiscard]] static Result<std::shared_ptr<const S3Client>> shared();

 private:
  struct Response {
    long status = 0;
    std::string body;
    std::string etag;
    int64_t content_length = -1;
  };
  // One request with retries. `query` is already canonical (sorted, encoded). Errors only for transport
  // failures after the last attempt and for 5xx after the last attempt; 4xx come back as a Response. A 2xx
  // body goes to `body_fd` when it is >= 0 (get_object_to_file), else into Response::body.
  Result<Response> request(std::string_view method, const std::string& bucket, const std::string& key,
                           const std::string& query, std::string_view body, int body_fd = -1) const;
  // A non-2xx answer as an Error naming the request and S3's code; a 401/403 also says whether this client had
  // credentials (an unsigned request is the usual cause of an AccessDenied with no body).
  Error http_error(std::string_view what, const std::string& bucket, const std::string& key, long status,
                   const std::string& body) const;

  S3Options options_;
};

/// Writes one object from appended bytes: one PUT when it stays under the multipart threshold, otherwise a
/// multipart upload whose parts go out as they fill (memory: one part). finish() completes it; abort() (or the
/// destructor without finish) aborts the multipart upload so no part is left billed. Not thread-safe.
class S3ObjectWriter {
 public:
  S3ObjectWriter(std::shared_ptr<const S3Client> client, std::string bucket, std::string key);
  ~S3ObjectWriter();
  S3ObjectWriter(const S3ObjectWriter&) = delete;
  S3ObjectWriter& operator=(const S3ObjectWriter&) = delete;

  [[nodiscard]] Status append(const void* data, size_t n);
  [[nodiscard]] Status finish();
  void abort() noexcept;
  /// Parts uploaded so far (0 for a single PUT).
  int parts() const noexcept { return static_cast<int>(etags_.size()); }

 private:
  Status flush_part();

  std::shared_ptr<const S3Client> client_;
  std::string bucket_;
  std::string key_;
  std::string buffer_;
  std::string upload_id_;
  std::vector<std::string> etags_;
  bool done_ = false;
};

}  // namespace sluice
