// libFuzzer target: SafetensorsFile::parse on arbitrary bytes.
//
// Every input must either be rejected with fanout::Error or parse into entries that lie wholly
// inside the input and agree with their dtype and shape; every byte of every tensor is then read
// through the Tensor view, so an entry that points outside the buffer is an ASan report. Any
// other exception escapes and libFuzzer records it as a crash.
#include <cstddef>
#include <cstdint>

#include "fanout/core/error.h"
#include "fanout/io/safetensors.h"

namespace {

[[noreturn]] void invariant_broken() { __builtin_trap(); }

uint64_t read_every_tensor(const fanout::io::SafetensorsFile& file, size_t size) {
    uint64_t checksum = 0;
    for (const auto& name : file.names()) {
        const fanout::io::TensorEntry& e = file.entry(name);
        if (e.offset < 8 || e.offset > size || e.nbytes > size - e.offset) invariant_broken();
        if (e.nbytes != static_cast<size_t>(fanout::shape_numel(e.shape)) * fanout::dtype_size(e.dtype))
            invariant_broken();
        const fanout::Tensor t = file.tensor(name);
        if (t.nbytes() != e.nbytes) invariant_broken();
        const auto* bytes = t.data_as<const uint8_t>();
        for (size_t i = 0; i < e.nbytes; ++i) checksum += bytes[i];
    }
    return checksum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        const auto file = fanout::io::SafetensorsFile::parse(nullptr, data, size, "fuzz");
        volatile uint64_t sink = read_every_tensor(file, size);
        (void)sink;
    } catch (const fanout::Error&) {
        // A rejected input: the expected outcome for almost every mutation.
    }
    return 0;
}
