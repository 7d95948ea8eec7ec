// Configuration of the Pyroscope push exporter (SPEC sections 5 and 6; issue 4). Filled from
// flags by agent/config; secrets arrive here already read from their files (never from argv).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace parascope {

struct PyroscopeOptions {
  // Base URL of the server: http://host[:port][/prefix] or https://... (default ports 80/443).
  // Credentials in the URL are refused (they would sit on argv); a path prefix is only possible
  // with the Connect protocol (gRPC method paths are fixed).
  std::string url;
  // "grpc": grpc++ over HTTP/2 (cleartext with prior knowledge for http://, TLS for https://).
  // "connect": Connect unary, HTTP/1.1 POST application/proto through cpp-httplib's client.
  std::string protocol = "grpc";
  // Sent as X-Scope-OrgID when not empty.
  std::string tenant_id;
  // HTTP basic auth (Authorization: Basic ...) when basic_auth_user is set; the password is the
  // content of --basic-auth-password-file. Exclusive with bearer_token.
  std::string basic_auth_user, basic_auth_password;
  // Authorization: Bearer <token> when set (content of --bearer-token-file).
  std::string bearer_token;
  // Extra request headers (--remote-header K=V), sent with every request.
  std::vector<std::pair<std::string, std::string>> headers;
  // PEM files: CA bundle to verify the server (default: the system's roots), client
  // certificate and key (both or neither). Only with https://. gRPC reads them once at start;
  // Connect checks them at start too and loads them again before a request once one changed on
  // disk (certificate rotation).
  std::string tls_ca_file, tls_cert_file, tls_key_file;
  // Bound of the send queue in bytes (serialized requests); the oldest are dropped beyond it.
  size_t queue_max_bytes = 64 << 20;
  // Deadline of one push request (gRPC deadline; for Connect the bound of connect + TLS + the
  // whole exchange, also sent as Connect-Timeout-Ms).
  absl::Duration request_timeout = absl::Seconds(10);
  // Retry delay: uniformly random in [0, min(backoff_max, backoff_initial * 2^n)) after the
  // n-th consecutive failure ("full jitter").
  absl::Duration backoff_initial = absl::Milliseconds(500), backoff_max = absl::Seconds(30);
  // Shutdown() keeps delivering the queue for at most this long.
  absl::Duration shutdown_timeout = absl::Seconds(5);
  // The collection interval. Ready() turns false once the endpoint has been unreachable for
  // longer than two windows.
  absl::Duration window = absl::Seconds(15);
  // Profiles older than this when their turn comes are dropped (reason "expired") instead of
  // being sent: the server rejects time_nanos older than an hour (SPEC section 6).
  absl::Duration max_profile_age = absl::Minutes(55);
  // Sample label keys kept in pushed profiles; others (thread_name, tid, pid) are removed and
  // their samples merged, since Pyroscope makes every string sample label a series label (SPEC
  // section 3: only low-cardinality labels unless asked for more). `process` is on group
  // profiles only (--latency-group=cgroup, command mode): the comms of one group's programs,
  // few, and the only way to split a group's profile by program on the server.
  std::vector<std::string> sample_label_keys = {"state", "parallelism", "process"};
};

}  // namespace parascope
