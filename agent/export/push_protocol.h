// Pure helpers of the Pyroscope push protocol (SPEC section 6): remote URL parsing, request
// headers, the retry classification of HTTP statuses and gRPC / Connect codes, backoff with
// full jitter, and sample ids (UUID v4). No I/O; unit-tested in test/unit/push_test.cc.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/export/pyroscope_options.h"

namespace parascope {

// The RPC path, for gRPC and for Connect (appended to the URL's path prefix).
inline constexpr char kPushMethodPath[] = "/push.v1.PusherService/Push";

// A parsed --remote-url.
struct RemoteUrl {
  std::string scheme;  // "http" or "https"
  std::string host;    // a name, an IPv4 address, or an IPv6 address without brackets
  int port = 0;        // explicit, else 80 / 443
  std::string path;    // prefix without trailing '/', "" for none
  bool tls() const { return scheme == "https"; }
  // "host:port" ("[v6]:port"), the gRPC target.
  std::string Authority() const;
  // scheme://authority/prefix, the Connect base and what logs show.
  std::string Base() const;
};

// Parses "http[s]://host[:port][/prefix]". Errors: InvalidArgument for another scheme, a missing
// host, a bad port, a query or fragment, or user:password@ in the URL (secrets do not belong on
// argv: use --basic-auth-user and --basic-auth-password-file).
absl::StatusOr<RemoteUrl> ParseRemoteUrl(absl::string_view url);

// The headers of every request, in order: X-Scope-OrgID, Authorization (Basic or Bearer), then
// options.headers. Errors: InvalidArgument for both basic auth and a bearer token, a header name
// that is not an HTTP token, a value with CR/LF/NUL, or a name the transports own (Content-Type,
// Content-Length, Host, TE, Connect-*, grpc-*, pseudo-headers).
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> PushHeaders(
    const PyroscopeOptions& options);

// SPEC section 6: retry HTTP 408, 429 and 5xx; everything else (400, 401, 403, 404, ...) is final.
bool IsRetryableHttpStatus(int status);
// SPEC section 6: retry UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, INTERNAL, UNKNOWN,
// ABORTED, DATA_LOSS (grpc::StatusCode numbers 14, 4, 8, 13, 2, 10, 15); never INVALID_ARGUMENT,
// UNAUTHENTICATED, PERMISSION_DENIED or any other code.
bool IsRetryableGrpcCode(int code);
// "OK", "CANCELLED", ..., "UNAUTHENTICATED" for codes 0..16; "CODE_<n>" otherwise.
std::string GrpcCodeName(int code);
// The gRPC code of a name as GrpcCodeName prints it or as Connect spells it in error bodies
// ("resource_exhausted"); -1 if unknown.
int GrpcCodeFromName(absl::string_view name);
// The HTTP status Connect uses for a gRPC code (connectrpc.com protocol, "Error codes"), e.g.
// RESOURCE_EXHAUSTED -> 429, INVALID_ARGUMENT -> 400, UNAVAILABLE -> 503.
int ConnectHttpStatus(int grpc_code);

// Upper bound of the n-th retry delay (n = 0 after the first failure):
// min(max, initial * 2^n), never below zero.
absl::Duration BackoffCeiling(int attempt, absl::Duration initial, absl::Duration max);
// Full jitter: u * BackoffCeiling(...), with u uniform in [0, 1) supplied by the caller.
absl::Duration BackoffDelay(int attempt, absl::Duration initial, absl::Duration max, double u);

// A random (version 4, RFC 4122 variant) UUID in canonical lowercase form,
// "xxxxxxxx-xxxx-4xxx-[89ab]xxx-xxxxxxxxxxxx". Thread-safe.
std::string NewUuidV4();
// The UUID text of 16 bytes with the version and variant bits set (exposed for tests).
std::string UuidV4FromBytes(std::array<uint8_t, 16> bytes);
// True for canonical lowercase v4 UUID text as NewUuidV4 produces.
bool IsUuidV4(absl::string_view text);

}  // namespace parascope
