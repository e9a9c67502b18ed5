#include "fanout/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "fanout/io/json_util.h"

namespace fanout::io {
namespace {

constexpr size_t kMaxHeaderBytes = 100u << 20;  // the reference implementation's limit

}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
    // A FIFO, a device or a folder is refused before it is opened (open() on a FIFO would block).
    const int fd = open_regular_file(path);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        FANOUT_FAIL("cannot stat {}: {}", path, std::strerror(err));
    }
    std::shared_ptr<MappedFile> f(new MappedFile());
    f->path_ = path;
    f->size_ = static_cast<size_t>(st.st_size);
    if (f->size_ > 0) {
        void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            const int err = errno;
            ::close(fd);
            FANOUT_FAIL("cannot mmap {} ({} bytes): {}", path, f->size_, std::strerror(err));
        }
        f->data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
    return f;
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
    auto file = MappedFile::open(path);
    return parse(file, file->data(), file->size(), path);
}

SafetensorsFile SafetensorsFile::parse(std::shared_ptr<MappedFile> file, const uint8_t* data, size_t size,
                                       const std::string& label) {
    SafetensorsFile st;
    st.label_ = label;
    st.file_ = std::move(file);
    st.base_ = data;
    FANOUT_CHECK(size >= 8, "{}: truncated safetensors file: {} bytes, need at least 8 for the header length", label,
                 size);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
    FANOUT_CHECK(header_len <= kMaxHeaderBytes, "{}: header length {} exceeds the {}-byte limit", label, header_len,
                 kMaxHeaderBytes);
    FANOUT_CHECK(header_len <= size - 8, "{}: truncated: header length {} but only {} bytes follow", label, header_len,
                 size - 8);
    const size_t data_start = 8 + header_len;
    const size_t data_size = size - data_start;

    nlohmann::json header;
    try {
        header = nlohmann::json::parse(data + 8, data + data_start);
    } catch (const nlohmann::json::exception& e) {
        FANOUT_FAIL("{}: header is not valid JSON: {}", label, e.what());
    }
    FANOUT_CHECK(header.is_object(), "{}: header must be a JSON object, found {}", label, header.type_name());

    for (const auto& [name, value] : header.items()) {
        if (name == "__metadata__") {
            FANOUT_CHECK(value.is_object(), "{}: __metadata__ must be an object", label);
            for (const auto& [k, v] : value.items())
                if (v.is_string()) st.metadata_[k] = v.get<std::string>();
            continue;
        }
        FANOUT_CHECK(value.is_object(), "{}: tensor '{}': entry must be an object", label, name);
        const auto dt = value.find("dtype");
        const auto sh = value.find("shape");
        const auto off = value.find("data_offsets");
        FANOUT_CHECK(dt != value.end() && dt->is_string(), "{}: tensor '{}': missing string field 'dtype'", label,
                     name);
        FANOUT_CHECK(sh != value.end() && sh->is_array(), "{}: tensor '{}': missing array field 'shape'", label, name);
        FANOUT_CHECK(off != value.end() && off->is_array() && off->size() == 2,
                     "{}: tensor '{}': 'data_offsets' must be an array of two integers", label, name);
        TensorEntry e;
        e.name = name;
        const std::string dtype_str = dt->get<std::string>();
        FANOUT_CHECK(dtype_from_name(dtype_str, &e.dtype), "{}: tensor '{}': unknown dtype '{}'", label, name,
                     dtype_str);
        uint64_t numel = 1;
        for (const auto& d : *sh) {
            FANOUT_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                         "{}: tensor '{}': shape entries must be non-negative integers, found {}", label, name,
                         describe_json(d));
            const uint64_t extent = d.get<uint64_t>();
            FANOUT_CHECK(extent == 0 || numel <= std::numeric_limits<uint32_t>::max() * uint64_t{16} / extent,
                         "{}: tensor '{}': shape {} is too large", label, name, describe_json(*sh));
            numel *= extent;
            e.shape.push_back(static_cast<int64_t>(extent));
        }
        for (const auto& o : *off)
            FANOUT_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0),
                         "{}: tensor '{}': data_offsets must be non-negative integers, found {}", label, name,
                         describe_json(*off));
        const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
        FANOUT_CHECK(begin <= end, "{}: tensor '{}': data_offsets [{}, {}] begin past end", label, name, begin, end);
        FANOUT_CHECK(end <= data_size,
                     "{}: tensor '{}': data_offsets [{}, {}] out of range for {} data bytes (file truncated?)", label,
                     name, begin, end, data_size);
        const uint64_t expected = numel * dtype_size(e.dtype);
        FANOUT_CHECK(end - begin == expected,
                     "{}: tensor '{}': {} bytes in data_offsets but dtype {} and shape {} need {}", label, name,
                     end - begin, dtype_str, shape_str(e.shape), expected);
        e.offset = data_start + begin;
        e.nbytes = end - begin;
        st.entries_.emplace(name, std::move(e));
    }
    // No two tensors share bytes (the format's own rule): an overlap would alias two weights.
    std::vector<const TensorEntry*> by_offset;
    for (const auto& [name, e] : st.entries_)
        if (e.nbytes > 0) by_offset.push_back(&e);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const TensorEntry* a, const TensorEntry* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
        const TensorEntry &prev = *by_offset[i - 1], &cur = *by_offset[i];
        FANOUT_CHECK(cur.offset >= prev.offset + prev.nbytes,
                     "{}: tensors '{}' and '{}' overlap: data_offsets [{}, {}] and [{}, {}]", label, prev.name,
                     cur.name, prev.offset - data_start, prev.offset - data_start + prev.nbytes,
                     cur.offset - data_start, cur.offset - data_start + cur.nbytes);
    }
    return st;
}

const TensorEntry& SafetensorsFile::entry(const std::string& name) const {
    const auto it = entries_.find(name);
    FANOUT_CHECK(it != entries_.end(), "{}: no tensor named '{}'", label_, name);
    return it->second;
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
    const TensorEntry& e = entry(name);
    return Tensor::view(const_cast<uint8_t*>(base_ + e.offset), e.dtype, e.shape, Device::kCPU, file_);
}

bool SafetensorsFile::offset_of(const void* p, size_t nbytes, size_t* offset) const {
    if (!file_ || file_->data() == nullptr) return false;
    const auto* b = static_cast<const uint8_t*>(p);
    if (b < file_->data() || b > file_->data() + file_->size() ||
        nbytes > static_cast<size_t>(file_->data() + file_->size() - b))
        return false;
    *offset = static_cast<size_t>(b - file_->data());
    return true;
}

std::vector<std::string> SafetensorsFile::names() const {
    std::vector<std::string> out;
    out.reserve(entries_.size());
    for (const auto& [name, e] : entries_) out.push_back(name);
    return out;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<TensorSpec> specs,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path) {
    std::stable_sort(specs.begin(), specs.end(), [](const TensorSpec& a, const TensorSpec& b) {
        return dtype_size(a.dtype) > dtype_size(b.dtype);
    });
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    size_t offset = 0;
    for (const auto& s : specs) {
        const size_t n = static_cast<size_t>(shape_numel(s.shape)) * dtype_size(s.dtype);
        FANOUT_CHECK(!header.contains(s.name), "{}: tensor '{}' listed twice", path, s.name);
        header[s.name] = {
            {"dtype", std::string(dtype_name(s.dtype))}, {"shape", s.shape}, {"data_offsets", {offset, offset + n}}};
        slots_[s.name] = Slot{offset, n, 0};
        offset += n;
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
    for (auto& [name, slot] : slots_) slot.offset += 8 + text.size();
    file_ = std::fopen(path.c_str(), "wb");
    FANOUT_CHECK(file_ != nullptr, "cannot create {}: {}", path, std::strerror(errno));
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
    FANOUT_CHECK(std::fwrite(len, 1, 8, file_) == 8 && std::fwrite(text.data(), 1, text.size(), file_) == text.size(),
                 "write to {} failed: {}", path, std::strerror(errno));
}

SafetensorsWriter::~SafetensorsWriter() {
    if (file_) std::fclose(file_);
}

void SafetensorsWriter::write(const std::string& name, const void* data, size_t nbytes) {
    FANOUT_CHECK(file_ != nullptr, "{}: write of '{}' after finish()", path_, name);
    const auto it = slots_.find(name);
    FANOUT_CHECK(it != slots_.end(), "{}: '{}' is not one of the file's tensors", path_, name);
    Slot& slot = it->second;
    FANOUT_CHECK(slot.written + nbytes <= slot.size, "{}: tensor '{}' takes {} bytes, got {}", path_, name, slot.size,
                 slot.written + nbytes);
    if (nbytes == 0) return;
    FANOUT_CHECK(::fseeko(file_, static_cast<off_t>(slot.offset + slot.written), SEEK_SET) == 0 &&
                     std::fwrite(data, 1, nbytes, file_) == nbytes,
                 "write to {} failed: {}", path_, std::strerror(errno));
    slot.written += nbytes;
}

void SafetensorsWriter::finish() {
    for (const auto& [name, slot] : slots_)
        FANOUT_CHECK(slot.written == slot.size, "{}: tensor '{}' got {} of its {} bytes", path_, name, slot.written,
                     slot.size);
    const int rc = std::fclose(file_);
    file_ = nullptr;
    FANOUT_CHECK(rc == 0, "closing {} failed: {}", path_, std::strerror(errno));
}

}  // namespace fanout::io
