// Routes libbpf's messages into parascope's log: warnings at warning level, the verifier's
// chatter at debug.
#pragma once

namespace parascope {

// Installs the libbpf print callback (libbpf_set_print). Idempotent.
void InstallLibbpfLogger();

}  // namespace parascope
