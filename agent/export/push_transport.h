// One Pyroscope push request over the wire (SPEC section 6): gRPC through grpc++ or Connect unary
// through cpp-httplib's client. The exporter's sender thread owns a transport; tests substitute a
// fake.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/export/push_protocol.h"
#include "agent/export/pyroscope_options.h"
#include "proto/push.pb.h"

namespace parascope {

// Outcome of one request.
struct PushResult {
  bool ok = false;
  // Worth retrying (SPEC section 6): network errors, HTTP 408/429/5xx, the retryable gRPC codes.
  bool retryable = false;
  // Failure code for metrics (push failures by code): a gRPC code name ("UNAVAILABLE"), an HTTP
  // status ("429"), or for failures before any response "connect" (refused / unreachable),
  // "timeout", "tls" (handshake or verification), "network" (anything else). "" when ok.
  std::string code;
  // Human-readable detail for the state-change log line; never contains request headers.
  std::string message;
  // Server-requested delay (Retry-After), zero if none.
  absl::Duration retry_after = absl::ZeroDuration();
};

// Sends push requests to one endpoint. Not thread-safe: one caller (the sender thread).
class PushTransport {
 public:
  virtual ~PushTransport() = default;
  // Sends `request` and waits for the response at most `timeout`. Never throws; every failure is
  // a PushResult.
  virtual PushResult Push(const push::v1::PushRequest& request, absl::Duration timeout) = 0;
  // Makes the request in progress, and any later one, fail at once (shutdown ran out of time).
  // Thread-safe; may be called while Push runs on another thread.
  virtual void Cancel() {}
};

// The transport for options.protocol ("grpc" or "connect") and the parsed options.url, with the
// headers of PushHeaders(options) and the TLS files read now. Errors: InvalidArgument for an
// unknown protocol, TLS files with an http:// URL, only one of cert/key, or a URL path prefix
// with gRPC; NotFound / PermissionDenied (from the file's errno) for an unreadable TLS file.
absl::StatusOr<std::unique_ptr<PushTransport>> MakePushTransport(const PyroscopeOptions& options,
                                                                 const RemoteUrl& url);

}  // namespace parascope
