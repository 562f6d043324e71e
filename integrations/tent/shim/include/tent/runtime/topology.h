// Shim of TENT's tent/runtime/topology.h (see common/status.h). The
// adapter only passes the local topology through install(); the shim's
// Topology holds nothing.
#ifndef ORBITE_TENT_SHIM_TOPOLOGY_H
#define ORBITE_TENT_SHIM_TOPOLOGY_H

namespace mooncake {
namespace tent {

class Topology {};

}  // namespace tent
}  // namespace mooncake

#endif
