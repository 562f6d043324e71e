// Shim of TENT's tent/common/status.h for building the OrbiTE adapter
// without TENT's tree (ctest). It declares the names the adapter and its
// tests use, with TENT's spelling and signatures (namespace mooncake::tent,
// the same codes and values); the implementation is ours. The adapter
// compiles unchanged against this shim and against TENT's own headers.
#ifndef ORBITE_TENT_SHIM_STATUS_H
#define ORBITE_TENT_SHIM_STATUS_H

#include <cstdint>
#include <string>
#include <string_view>

#define ORBITE_TENT_SHIM_STR(x) #x
#define ORBITE_TENT_SHIM_TOSTRING(x) ORBITE_TENT_SHIM_STR(x)
#ifndef LOC_MARK
#define LOC_MARK "\n    Raised at " __FILE__ ":" ORBITE_TENT_SHIM_TOSTRING(__LINE__)
#endif
#ifndef CHECK_STATUS
#define CHECK_STATUS(call)               \
    do {                                 \
        Status status = (call);          \
        if (!status.ok()) return status; \
    } while (0)
#endif

namespace mooncake {
namespace tent {

/// A call's outcome: a code and, unless OK, a message.
class Status final {
   public:
    enum class Code : uint16_t {
        kOk = 0,
        kInvalidArgument = 1,
        kTooManyRequests = 2,
        kAddressNotRegistered = 3,
        kDeviceNotFound = 4,
        kInvalidEntry = 5,
        kInvalidMetadataType = 6,
        kNeedsRefreshCache = 7,
        kRdmaError = 100,
        kCudaError = 101,
        kMetadataError = 131,
        kRpcServiceError = 132,
        kMalformedJson = 133,
        kInternalError = 199,
        kNotImplemented = 200,
        kMaxCode
    };

    Status() = default;
    Status(Code code, std::string_view message)
        : code_(code), message_(code == Code::kOk ? std::string() : std::string(message)) {}

    Code code() const { return code_; }
    std::string_view message() const { return message_; }
    [[nodiscard]] bool ok() const { return code_ == Code::kOk; }
    static Status OK() { return Status(); }
    /// The code's name and the message.
    std::string ToString() const;
    static std::string_view CodeToString(Code code);

#define ORBITE_TENT_SHIM_CODE(err)                                               \
    [[nodiscard]] bool Is##err() const { return code_ == Code::k##err; }         \
    static Status err(std::string_view msg) { return Status(Code::k##err, msg); }
    ORBITE_TENT_SHIM_CODE(InvalidArgument)
    ORBITE_TENT_SHIM_CODE(TooManyRequests)
    ORBITE_TENT_SHIM_CODE(AddressNotRegistered)
    ORBITE_TENT_SHIM_CODE(DeviceNotFound)
    ORBITE_TENT_SHIM_CODE(InvalidEntry)
    ORBITE_TENT_SHIM_CODE(InvalidMetadataType)
    ORBITE_TENT_SHIM_CODE(NeedsRefreshCache)
    ORBITE_TENT_SHIM_CODE(RdmaError)
    ORBITE_TENT_SHIM_CODE(CudaError)
    ORBITE_TENT_SHIM_CODE(MetadataError)
    ORBITE_TENT_SHIM_CODE(RpcServiceError)
    ORBITE_TENT_SHIM_CODE(MalformedJson)
    ORBITE_TENT_SHIM_CODE(InternalError)
    ORBITE_TENT_SHIM_CODE(NotImplemented)
#undef ORBITE_TENT_SHIM_CODE

   private:
    Code code_ = Code::kOk;
    std::string message_;
};

}  // namespace tent
}  // namespace mooncake

#endif
