// libFuzzer entry point for the safetensors reader: parses arbitrary bytes from memory and, when
// they load, touches every tensor the way a checkpoint loader would. Any crash, sanitizer report
// or exception other than InputError is a bug. Build and run: see fuzz/README.md.
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
    try {
        const auto file = bagualu::io::SafetensorsFile::from_memory(bytes, "fuzz.safetensors");
        for (const std::string& name : file.names()) {
            const auto& info = file.info(name);
            volatile std::byte sink{};
            for (std::byte b : file.bytes(name)) sink = b;
            (void)sink;  // the loop exists to touch every byte
            switch (info.dtype) {
                case bagualu::io::DType::F32:
                case bagualu::io::DType::BF16:
                case bagualu::io::DType::F16:
                case bagualu::io::DType::F64:
                    (void)file.read_f32(name);
                    break;
                default:
                    break;
            }
        }
        (void)file.metadata();
    } catch (const bagualu::InputError&) {
    }
    return 0;
}
