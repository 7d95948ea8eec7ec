#include "agent/export/push_protocol.h"

#include <algorithm>
#include <cmath>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace parascope {
namespace {

// grpc::StatusCode names in code order (grpcpp/support/status_code_enum.h).
constexpr const char* kGrpcCodeNames[] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};
constexpr int kNumGrpcCodes = sizeof(kGrpcCodeNames) / sizeof(kGrpcCodeNames[0]);

bool IsTokenChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
         absl::string_view("!#$%&'*+-.^_`|~").find(c) != absl::string_view::npos;
}

}  // namespace

std::string RemoteUrl::Authority() const {
  std::string h = host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host;
  return absl::StrCat(h, ":", port);
}

std::string RemoteUrl::Base() const { return absl::StrCat(scheme, "://", Authority(), path); }

absl::StatusOr<RemoteUrl> ParseRemoteUrl(absl::string_view url) {
  RemoteUrl out;
  absl::string_view rest = url;
  // Error messages show the URL without any user:password@ part.
  std::string shown(url);
  size_t scheme_end = shown.find("://");
  size_t at = shown.find('@', scheme_end == std::string::npos ? 0 : scheme_end);
  if (at != std::string::npos) {
    size_t start = scheme_end == std::string::npos ? 0 : scheme_end + 3;
    shown.replace(start, at - start, "<redacted>");
  }
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("--remote-url \"", shown, "\": ", why));
  };
  if (absl::ConsumePrefix(&rest, "http://")) {
    out.scheme = "http";
    out.port = 80;
  } else if (absl::ConsumePrefix(&rest, "https://")) {
    out.scheme = "https";
    out.port = 443;
  } else {
    return bad("the scheme must be http:// or https://");
  }
  if (rest.find_first_of("?#") != absl::string_view::npos) {
    return bad("a query or fragment is not allowed");
  }
  size_t slash = rest.find('/');
  absl::string_view authority = rest.substr(0, slash);
  absl::string_view path = slash == absl::string_view::npos ? "" : rest.substr(slash);
  if (authority.find('@') != absl::string_view::npos) {
    return bad(
        "credentials in the URL are not allowed (they would be visible on the command line); "
        "use --basic-auth-user and --basic-auth-password-file");
  }
  absl::string_view port_text;
  if (absl::ConsumePrefix(&authority, "[")) {
    size_t close = authority.find(']');
    if (close == absl::string_view::npos) return bad("unterminated IPv6 address");
    out.host = std::string(authority.substr(0, close));
    absl::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (!absl::ConsumePrefix(&after, ":")) return bad("junk after the IPv6 address");
      port_text = after;
      if (port_text.empty()) return bad("empty port");
    }
  } else {
    size_t colon = authority.find(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != absl::string_view::npos) {
      port_text = authority.substr(colon + 1);
      if (port_text.empty()) return bad("empty port");
    }
  }
  if (out.host.empty()) return bad("missing host");
  if (!port_text.empty()) {
    int port = 0;
    if (!absl::SimpleAtoi(port_text, &port) || port <= 0 || port > 65535) {
      return bad("the port must be a number in 1..65535");
    }
    out.port = port;
  }
  while (absl::ConsumeSuffix(&path, "/")) {
  }
  out.path = std::string(path);
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> PushHeaders(
    const PyroscopeOptions& options) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!options.tenant_id.empty()) out.emplace_back("X-Scope-OrgID", options.tenant_id);
  if (!options.basic_auth_user.empty() && !options.bearer_token.empty()) {
    return absl::InvalidArgumentError(
        "use either basic auth (--basic-auth-user) or a bearer token (--bearer-token-file), not "
        "both");
  }
  if (options.basic_auth_user.empty() && !options.basic_auth_password.empty()) {
    return absl::InvalidArgumentError("a basic auth password needs --basic-auth-user");
  }
  if (!options.basic_auth_user.empty()) {
    out.emplace_back(
        "Authorization",
        absl::StrCat("Basic ", absl::Base64Escape(absl::StrCat(options.basic_auth_user, ":",
                                                               options.basic_auth_password))));
  } else if (!options.bearer_token.empty()) {
    out.emplace_back("Authorization", absl::StrCat("Bearer ", options.bearer_token));
  }
  for (const auto& [name, value] : options.headers) {
    if (name.empty() || !std::all_of(name.begin(), name.end(), IsTokenChar)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--remote-header \"", name, "\": the name must be an HTTP token"));
    }
    if (value.find_first_of(std::string("\r\n\0", 3)) != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--remote-header \"", name, "\": the value must not contain CR, LF or NUL"));
    }
    std::string lower = absl::AsciiStrToLower(name);
    if (lower == "content-type" || lower == "content-length" || lower == "host" || lower == "te" ||
        lower == "transfer-encoding" || lower == "connection" ||
        absl::StartsWith(lower, "connect-") || absl::StartsWith(lower, "grpc-")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--remote-header \"", name, "\": this header is set by the push protocol itself"));
    }
    out.emplace_back(name, value);
  }
  return out;
}

bool IsRetryableHttpStatus(int status) {
  return status == 408 || status == 429 || (status >= 500 && status <= 599);
}

bool IsRetryableGrpcCode(int code) {
  switch (code) {
    case 2:   // UNKNOWN
    case 4:   // DEADLINE_EXCEEDED
    case 8:   // RESOURCE_EXHAUSTED
    case 10:  // ABORTED
    case 13:  // INTERNAL
    case 14:  // UNAVAILABLE
    case 15:  // DATA_LOSS
      return true;
    default:
      return false;
  }
}

std::string GrpcCodeName(int code) {
  if (code >= 0 && code < kNumGrpcCodes) return kGrpcCodeNames[code];
  return absl::StrCat("CODE_", code);
}

int GrpcCodeFromName(absl::string_view name) {
  std::string upper = absl::AsciiStrToUpper(name);
  if (upper == "CANCELED") return 1;  // Connect's spelling
  for (int i = 0; i < kNumGrpcCodes; ++i) {
    if (upper == kGrpcCodeNames[i]) return i;
  }
  return -1;
}

int ConnectHttpStatus(int grpc_code) {
  switch (grpc_code) {
    case 0:
      return 200;
    case 1:
      return 499;
    case 3:
      return 400;  // INVALID_ARGUMENT
    case 4:
      return 504;  // DEADLINE_EXCEEDED
    case 5:
      return 404;  // NOT_FOUND
    case 6:
      return 409;  // ALREADY_EXISTS
    case 7:
      return 403;  // PERMISSION_DENIED
    case 8:
      return 429;  // RESOURCE_EXHAUSTED
    case 9:
      return 400;  // FAILED_PRECONDITION
    case 10:
      return 409;  // ABORTED
    case 11:
      return 400;  // OUT_OF_RANGE
    case 12:
      return 501;  // UNIMPLEMENTED
    case 14:
      return 503;  // UNAVAILABLE
    case 16:
      return 401;  // UNAUTHENTICATED
    default:
      return 500;  // UNKNOWN, INTERNAL, DATA_LOSS, anything else
  }
}

absl::Duration BackoffCeiling(int attempt, absl::Duration initial, absl::Duration max) {
  if (initial <= absl::ZeroDuration() || max <= absl::ZeroDuration()) return absl::ZeroDuration();
  absl::Duration d = initial;
  for (int i = 0; i < attempt && d < max; ++i) d *= 2;
  return std::min(d, max);
}

absl::Duration BackoffDelay(int attempt, absl::Duration initial, absl::Duration max, double u) {
  u = std::clamp(u, 0.0, 1.0);
  return BackoffCeiling(attempt, initial, max) * u;
}

std::string UuidV4FromBytes(std::array<uint8_t, 16> b) {
  b[6] = (b[6] & 0x0f) | 0x40;  // version 4
  b[8] = (b[8] & 0x3f) | 0x80;  // RFC 4122 variant (10xx)
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[b[i] >> 4]);
    out.push_back(kHex[b[i] & 0xf]);
  }
  return out;
}

std::string NewUuidV4() {
  // absl::BitGen is seeded from the OS's entropy source; one generator per thread.
  thread_local absl::BitGen gen;
  std::array<uint8_t, 16> b;
  for (int i = 0; i < 16; i += 8) {
    uint64_t v = absl::Uniform<uint64_t>(gen);
    for (int j = 0; j < 8; ++j) b[i + j] = static_cast<uint8_t>(v >> (8 * j));
  }
  return UuidV4FromBytes(b);
}

bool IsUuidV4(absl::string_view t) {
  if (t.size() != 36) return false;
  for (size_t i = 0; i < t.size(); ++i) {
    char c = t[i];
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (c != '-') return false;
    } else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return false;
    }
  }
  return t[14] == '4' && (t[19] == '8' || t[19] == '9' || t[19] == 'a' || t[19] == 'b');
}

}  // namespace parascope
