// HMC: vendor-neutral communication for mixed-vendor GPU clusters. Include this.
#pragma once

#include "hmc/collectives.h"
#include "hmc/communicator.h"
#include "hmc/context.h"
#include "hmc/memory.h"
#include "hmc/memory_region.h"
#include "hmc/request.h"
#include "hmc/status.h"
#include "hmc/stream.h"
#include "hmc/types.h"
#include "hmc/unique_id.h"
