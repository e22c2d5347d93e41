// CRC32C (Castagnoli polynomial 0x1EDC6F41, reflected; the checksum of iSCSI, ext4 and
// RocksDB), which checkpoint manifests record for every file and the offload swap store for
// every extent. Debian's Abseil (20220623) has no absl/crc, so it lives here, in the bottom layer
// both may include: the SSE4.2 instruction where the CPU has it, a table elsewhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace zt {

// The CRC32C of the bytes so far followed by [data, data + size): `crc` is the value returned
// for the bytes so far, 0 for none. Crc32cExtend(0, "123456789", 9) == 0xE3069283.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

// The manifest's spelling: 8 lowercase hex digits.
std::string Crc32cToHex(uint32_t crc);
// The value of 8 lowercase hex digits, or nullopt for anything else.
std::optional<uint32_t> Crc32cFromHex(const std::string& hex);

}  // namespace zt
