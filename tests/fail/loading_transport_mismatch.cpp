// needs: torch
// expected-error: accel: PreparedLoader: the configuration's loading policy and the transport disagree
// A configuration of dispatched loading (rank 0 reads for all) with the transport of sharded loading.
#include <accel/data/prepare.hpp>
#include <vector>
using Dataset = accel::data::RangeDataset<std::vector<int>>;
using Dispatched = accel::Config<accel::dist::gloo, accel::loading::dispatched>;
using Loader = accel::data::PreparedLoader<
    accel::pipeline::PlannedSource<Dataset, accel::data::DefaultCollate, Dispatched, accel::pipeline::LocalTransport>,
    accel::pipeline::LocalTransport>;
Loader loader;
