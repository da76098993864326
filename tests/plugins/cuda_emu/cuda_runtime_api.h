// Stand-in for the CUDA runtime header under the host emulation (cuda_emu.h).
#pragma once
#include "cuda_emu.h"
