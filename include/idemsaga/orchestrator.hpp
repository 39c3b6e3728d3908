// Run an orchestrator of your own sagas: the parent keys, the runs API, recovery and traces.
//   #include <idemsaga/orchestrator.hpp>
//   orchestrator::Orchestrator o(options, sagas);
#pragma once

#include "common/crypto.hpp"
#include "common/pg/migrate.hpp"
#include "common/pg/url.hpp"
#include "idemsaga/saga.hpp"
#include "orchestrator/orchestrator.hpp"
