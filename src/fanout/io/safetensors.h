// safetensors files: a validating, memory-mapped reader and a streaming writer.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data;
// offsets are relative to the end of the header. The reader checks every field against the file
// before anything is read through it, so a truncated or corrupt file is an Error naming the file,
// the tensor and what was expected — never a read out of bounds.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fanout/core/tensor.h"

namespace fanout::io {

// A read-only memory mapping of a whole file.
class MappedFile {
  public:
    static std::shared_ptr<MappedFile> open(const std::string& path);
    ~MappedFile();
    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

  private:
    MappedFile() = default;
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

struct TensorEntry {
    std::string name;
    DType dtype;
    Shape shape;
    size_t offset = 0;  // from the start of the file
    size_t nbytes = 0;
};

class SafetensorsFile {
  public:
    // Opens and validates; throws Error naming the file and the defect.
    static SafetensorsFile open(const std::string& path);
    // Parses an in-memory image (the fuzz target's entry); `label` names it in errors.
    static SafetensorsFile parse(std::shared_ptr<MappedFile> file, const uint8_t* data, size_t size,
                                 const std::string& label);

    const std::string& path() const { return label_; }
    bool has(const std::string& name) const { return entries_.count(name) != 0; }
    const TensorEntry& entry(const std::string& name) const;
    // A CPU view of the tensor's bytes in the mapping (kept alive by the view).
    Tensor tensor(const std::string& name) const;
    std::vector<std::string> names() const;
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    // The file offset of `nbytes` bytes at `p` when they lie in this file's mapping; else false.
    bool offset_of(const void* p, size_t nbytes, size_t* offset) const;

  private:
    std::string label_;
    std::shared_ptr<MappedFile> file_;
    const uint8_t* base_ = nullptr;
    std::map<std::string, TensorEntry> entries_;
    std::map<std::string, std::string> metadata_;
};

struct TensorSpec {
    std::string name;
    DType dtype;
    Shape shape;
};

// Writes a safetensors file whose tensors are known up front and whose data arrives in pieces,
// so files larger than memory can be written. The data section is laid out by element size,
// largest first (as the reference writer does), so every tensor is aligned to its dtype; pieces of
// a tensor are appended in order, and tensors may be written in any order.
class SafetensorsWriter {
  public:
    SafetensorsWriter(const std::string& path, std::vector<TensorSpec> specs,
                      const std::map<std::string, std::string>& metadata = {});
    ~SafetensorsWriter();
    // Appends `nbytes` bytes to tensor `name` (several calls may make up one tensor).
    void write(const std::string& name, const void* data, size_t nbytes);
    // Checks that every tensor was written in full and closes the file.
    void finish();

  private:
    struct Slot {
        size_t offset = 0, size = 0, written = 0;  // offset from the start of the file
    };
    std::string path_;
    std::map<std::string, Slot> slots_;
    std::FILE* file_ = nullptr;
};

}  // namespace fanout::io
