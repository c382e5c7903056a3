// Copyright TileMaxSim authors. Everything public, in one include.
#pragma once

#include "tilemaxsim/estimate.h"
#include "tilemaxsim/index_builder.h"
#include "tilemaxsim/index_updater.h"
#include "tilemaxsim/log.h"
#include "tilemaxsim/metadata.h"
#include "tilemaxsim/options.h"
#include "tilemaxsim/searcher.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"
#include "tilemaxsim/version.h"
