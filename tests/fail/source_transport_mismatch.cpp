// needs: torch
// expected-error: accel: StreamDispatchSource reads the stream on one rank and describes every step to the others: it needs a transport with one reader
// A step source and a transport that disagree on which ranks read: the stream read by one rank for all, moved by
// the transport of sharded loading (every rank reads its own batch).
#include <accel/data/prepare.hpp>
#include <vector>
using Stream = std::vector<int>;  // an input range with no get(): an iterable dataset
using Sharded = accel::Config<accel::dist::gloo>;
using Loader =
    accel::data::PreparedLoader<accel::pipeline::StreamDispatchSource<Stream, accel::data::DefaultCollate, Sharded,
                                                                      accel::pipeline::LocalTransport>,
                                accel::pipeline::LocalTransport>;
Loader loader;
