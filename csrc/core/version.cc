#include "lowcomm/version.h"

namespace lowcomm {

int version() {
  return LOWCOMM_VERSION_CODE;
}

}  // namespace lowcomm
