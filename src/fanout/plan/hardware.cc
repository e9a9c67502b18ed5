#include "fanout/plan/hardware.h"

#include "fanout/core/error.h"

namespace fanout::plan {

Hardware h100_sxm() { return {"H100 SXM", 80e9, 3.35e12, 1979e12, 989e12, 450e9, 50e9, 8}; }

Hardware h200_sxm() {
    Hardware h = h100_sxm();
    h.name = "H200 SXM";
    h.hbm_bytes = 141e9;
    h.hbm_bw = 4.8e12;
    return h;
}

Hardware hardware_preset(const std::string& name) {
    if (name == "h100") return h100_sxm();
    if (name == "h200") return h200_sxm();
    FANOUT_FAIL("unknown hardware preset '{}' (have h100, h200)", name);
}

}  // namespace fanout::plan
