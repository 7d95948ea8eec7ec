// Owning handles of libdeflate's compressor and decompressor (libdeflate.h: alloc/free pairs).
#pragma once

#include <libdeflate.h>

#include <memory>

namespace parascope {

struct LibdeflateFree {
  void operator()(libdeflate_compressor* c) const { libdeflate_free_compressor(c); }
  void operator()(libdeflate_decompressor* d) const { libdeflate_free_decompressor(d); }
};
// Null when libdeflate could not allocate it.
using DeflateCompressor = std::unique_ptr<libdeflate_compressor, LibdeflateFree>;
using DeflateDecompressor = std::unique_ptr<libdeflate_decompressor, LibdeflateFree>;

}  // namespace parascope
