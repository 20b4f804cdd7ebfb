// The emulated binary's TestDevice (test_device.h): a fresh host emulation per process.

#include "emulated_device.h"

namespace lowcomm::testing {

std::shared_ptr<TestDevice> install_device(std::string*) {
  auto d = std::make_shared<EmulatedDevice>();
  device::set_runtime_for_testing(d);
  return d;
}

bool emulated_device() {
  return true;
}

}  // namespace lowcomm::testing
