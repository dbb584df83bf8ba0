"""Beam's Dask runner with its translation corrected where it is wrong for any pipeline (`--runner DaskRunner`).

The one place that works around Beam's Dask runner (apache_beam.runners.dask, Beam 2.77), and so the
one place, beside this package's __init__, that uses Beam's private and runner-internal names: each one
is listed in PINNED_NAMES, which tests/pipeline/beam_internals/test_dask.py checks against the installed
Beam and against this file's source. The public entry is pipeline/dask_runner.py.

Its graph translation (transform_evaluator.py, DaskRunner.run_pipeline) has these faults, none of
them specific to this project's graph:

1. Tagged outputs are mixed up. `apply_dofn_to_bundle` returns a bundle's outputs as
   `[v.value for v in tagged_receivers.values]`, dropping every output's tag, and the visitor hands
   each consumer the producer's whole bag. So a consumer of one output of a ParDo `with_outputs`
   receives every output of it (here: the manifest's file records got batch counters, and the dead
   letter concatenation got `(source, FileRead)` tuples instead of tables), and
   `(out.a, out.b) | Flatten()` receives everything twice.
2. Only the last visited transform is computed (`list(dask_visitor.bags.values())[-1]`): a sink the
   last transform does not depend on never runs, silently.
3. The output receivers are built once, when the graph is translated, and read before
   `finish_bundle`: bundles of one ParDo that run in one process without being deserialized apart
   (a threaded or in-process cluster) append to the same list (measured: Count.Globally of 6
   elements gave 24), and what `finish_bundle` outputs is lost. Here each bundle builds its own
   receivers and collects after `finish_bundle`; each worker thread has its own DoFn instances
   (from Beam's pickler), set up once and reused across bundles as Beam's workers do.
4. A transform it has no translation for becomes a silent pass-through (`NoOp`); here it is an error,
   except for the two its own overrides mean to pass through.
5. `Create` puts up to 128 elements in one partition, i.e. one task on one worker. Beam's `Create`
   elsewhere ends in a reshuffle (each element may go to any worker); a pipeline whose `Create`
   lists units of work (here: file groups) would run them all on one worker. Unless
   --dask_npartitions or --dask_partition_size says otherwise, the elements are spread over
   PARTITIONS_PER_THREAD partitions per worker thread connected when the run is submitted (one
   partition per element when none is).
6. Partitions multiply: Flatten concatenates its inputs' partitions, and GroupByKey's task shuffle
   makes about n² tasks for n partitions, so with one partition per file group a small run became
   6,111 tasks and 15 s of scheduling. Here Flatten keeps its largest input's partition count and
   GroupByKey shuffles over at most SHUFFLE_PARTITIONS partitions, then splits its output back.
7. The client it opens, and the LocalCluster that opens without --dask_client_address, are never
   closed. Here they are closed when the run ends; the LocalCluster is started explicitly (worker
   processes and threads by Dask's defaults for this machine, no dashboard).

Everything else (Create's and GroupByKey's bags, side inputs, the overrides) is Beam's own translation.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import typing as t
from functools import partial

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.internal import pickler
from apache_beam.pipeline import PipelineVisitor
from apache_beam.runners.common import DoFnContext, DoFnInvoker, DoFnSignature, Receiver, _OutputHandler
from apache_beam.runners.dask import dask_runner as beam_dask
from apache_beam.runners.dask import overrides
from apache_beam.runners.dask import transform_evaluator as beam_ops
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms.sideinputs import SideInputMap
from dask.bag import concat

DaskOptions = beam_dask.DaskOptions

# Every name this module takes from Beam beyond its public pipeline API (apache_beam, pvalue,
# PipelineVisitor, PipelineState): the Dask runner's classes and translations, the DoFn invocation
# machinery a ParDo bundle runs on, and the private members a side input's translation reads. A Beam
# upgrade that moves one fails tests/pipeline/beam_internals/test_dask.py before any run does.
PINNED_NAMES = (
    "apache_beam.internal.pickler.dumps",
    "apache_beam.internal.pickler.loads",
    "apache_beam.runners.common.DoFnContext",
    "apache_beam.runners.common.DoFnInvoker",
    "apache_beam.runners.common.DoFnInvoker.create_invoker",
    "apache_beam.runners.common.DoFnSignature",
    "apache_beam.runners.common.Receiver",
    "apache_beam.runners.common._OutputHandler",
    "apache_beam.runners.dask.dask_runner.DaskOptions",
    "apache_beam.runners.dask.dask_runner.DaskOptions._extract_bag_kwargs",
    "apache_beam.runners.dask.dask_runner.DaskRunner",
    "apache_beam.runners.dask.dask_runner.DaskRunnerResult",
    "apache_beam.runners.dask.overrides._Create",
    "apache_beam.runners.dask.overrides._Flatten",
    "apache_beam.runners.dask.overrides._GroupAlsoByWindow",
    "apache_beam.runners.dask.overrides._GroupByKeyOnly",
    "apache_beam.runners.dask.overrides._Reshuffle",
    "apache_beam.runners.dask.overrides.dask_overrides",
    "apache_beam.runners.dask.transform_evaluator.Create",
    "apache_beam.runners.dask.transform_evaluator.DaskBagOp",
    "apache_beam.runners.dask.transform_evaluator.DaskBagWindowedIterator",
    "apache_beam.runners.dask.transform_evaluator.Flatten",
    "apache_beam.runners.dask.transform_evaluator.NoOp",
    "apache_beam.runners.dask.transform_evaluator.TRANSLATIONS",
    "apache_beam.runners.dask.transform_evaluator.defenestrate",
    "apache_beam.runners.dask.transform_evaluator.get_windowed_value",
    "apache_beam.transforms.sideinputs.SideInputMap",
    "apache_beam.pvalue.AsSideInput._view_options",
    "apache_beam.pvalue.AsSideInput._window_mapping_fn",
)


class DaskRunner(beam_dask.DaskRunner):
    """Beam's DaskRunner with the translation above; otherwise the same options and behaviour."""

    def run_pipeline(self, pipeline, options):
        import dask
        import dask.distributed as ddist

        quiet = logging.getLogger("distributed")  # Dask's config logs every connection and close at INFO
        quiet.setLevel(max(quiet.getEffectiveLevel(), logging.WARNING))
        dask_options = options.view_as(DaskOptions).get_all_options(drop_default=True, current_only=True)
        bag_kwargs = DaskOptions._extract_bag_kwargs(dask_options)
        cluster = None
        if not dask_options.get("address") and not dask_options.get("scheduler_file"):
            cluster = ddist.LocalCluster(processes=True, host="127.0.0.1", dashboard_address=None)  # loopback only
            dask_options["address"] = cluster
        client = ddist.Client(**dask_options)
        try:
            threads = sum(client.nthreads().values())  # the workers connected now
            futures = client.compute(list(dask.optimize(*translate(pipeline, bag_kwargs, threads))))
        except BaseException:
            _close(client, cluster)
            raise
        return _Result(client, futures, cluster)


def translate(pipeline, bag_kwargs: dict | None = None, threads: int = 0) -> list:
    """The pipeline as Dask bags (nothing computed): the bags no transform reads, which hold the rest.
    `threads`: the cluster's worker threads (0: not known). Raises NotImplementedError for a transform
    the Dask runner cannot run (the dry run calls this)."""
    pipeline.replace_all(overrides.dask_overrides())
    visitor = _Translate(bag_kwargs or {}, threads)
    pipeline.visit(visitor)
    return visitor.sinks()


def bag_options(options) -> dict:
    """--dask_npartitions / --dask_partition_size, as Beam hands them to its Create translation."""
    given = options.view_as(DaskOptions).get_all_options(drop_default=True, current_only=True)
    return DaskOptions._extract_bag_kwargs(given)


@dataclasses.dataclass
class _Result(beam_dask.DaskRunnerResult):
    cluster: t.Any = None

    def wait_until_finish(self, duration=None):
        try:
            return super().wait_until_finish(duration)
        finally:
            if duration is None or self.state in (PipelineState.DONE, PipelineState.FAILED):
                _close(self.client, self.cluster)


def _close(client, cluster) -> None:
    client.close()
    if cluster is not None:
        cluster.close()


# Transforms Beam's overrides turn into pass-throughs on purpose: GroupByKey's translation already
# groups (so its GroupAlsoByWindow step has nothing left to do), and Reshuffle only redistributes.
PASS_THROUGH = (overrides._GroupAlsoByWindow, overrides._Reshuffle)


class _Translate(PipelineVisitor):
    """Beam's DaskBagVisitor, except: each consumer gets its own output of a ParDo (fault 1), every
    sink is computed (2), ParDo bundles are self-contained (3), unknown transforms fail (4), Create
    spreads its elements over the cluster (5), and partitions stay bounded (6)."""

    def __init__(self, bag_kwargs: dict, threads: int = 0):
        self.bag_kwargs = bag_kwargs
        self.threads = threads
        self.bags: dict = {}          # AppliedPTransform -> its bag
        self.tagged: set = set()      # ParDos whose bag holds (tag, value) pairs
        self.consumed: set = set()    # transforms whose output some transform reads

    def visit_transform(self, node) -> None:
        kind = node.transform.__class__
        if kind is beam.ParDo:
            op = _ParDo(node, bag_kwargs=self.bag_kwargs)
            self.tagged.add(node)
        elif kind is overrides._Create:
            op = beam_ops.Create(node, bag_kwargs=self.bag_kwargs or _spread(node.transform.values, self.threads))
        elif kind is overrides._GroupByKeyOnly:
            op = _GroupByKey(node, bag_kwargs=self.bag_kwargs)
        elif kind is overrides._Flatten:
            op = _Flatten(node, bag_kwargs=self.bag_kwargs)
        elif kind in beam_ops.TRANSLATIONS:
            op = beam_ops.TRANSLATIONS[kind](node, bag_kwargs=self.bag_kwargs)
        elif kind in PASS_THROUGH:
            op = beam_ops.NoOp(node, bag_kwargs=self.bag_kwargs)
        else:
            raise NotImplementedError(f"the Dask runner has no translation for {node.full_label} "
                                      f"({kind.__module__}.{kind.__name__})")
        inputs = [None if isinstance(v, pvalue.PBegin) else self._bag(v) for v in node.inputs]
        if len(inputs) == 1 and not isinstance(op, beam_ops.Flatten):
            inputs = inputs[0]
        side_inputs = None
        if node.side_inputs:
            side_inputs = []
            for side in node.side_inputs:
                side_inputs.append(SideInputMap(type(side), side._view_options(),
                                                beam_ops.DaskBagWindowedIterator(self._bag(side.pvalue),
                                                                                 side._window_mapping_fn)))
        self.bags[node] = op.apply(input_bag=inputs, side_inputs=side_inputs)

    def _bag(self, pcoll):
        producer = pcoll.producer
        self.consumed.add(producer)
        bag = self.bags[producer]
        if producer not in self.tagged:
            return bag
        tag = next(tag for tag, output in producer.outputs.items() if output is pcoll)
        return bag.filter(partial(_has_tag, tag)).map(_untag)

    def sinks(self) -> list:
        """The bags no transform reads: computing them all computes the whole pipeline."""
        return [bag for node, bag in self.bags.items() if node not in self.consumed and bag is not None]


# Create's elements go to this many partitions per worker thread: enough to even out file groups of
# different sizes, few enough that scheduling stays small next to the work. Measured on the
# benchmark's M (100 file groups, a LocalCluster of 2 single-threaded workers): a partition per
# group, 1,824 tasks and 16-22 s of CPU (scheduler and workers); 8 partitions, 272 tasks and 10-13 s.
PARTITIONS_PER_THREAD = 4


def _spread(values, threads: int) -> dict:
    """Create's partitions: PARTITIONS_PER_THREAD per worker thread, one per element while no worker is
    known (the cluster may still be starting)."""
    count = len(values) if not threads else min(len(values), PARTITIONS_PER_THREAD * threads)
    return {"npartitions": max(1, count)}


def _has_tag(tag, item) -> bool:
    return item[0] == tag


def _untag(item):
    return item[1]


# A GroupByKey shuffles over at most this many partitions (Dask's task shuffle makes about n² split
# tasks for n partitions), then splits its output back into as many partitions as its input had, so
# the transforms after it keep their parallelism.
SHUFFLE_PARTITIONS = 8


class _GroupByKey(beam_ops.DaskBagOp):
    """Beam's GroupByKey translation (Bag.groupby over the key) on at most SHUFFLE_PARTITIONS partitions,
    always with Dask's task shuffle (the disk shuffle only works on one machine)."""

    def apply(self, input_bag, side_inputs=None):
        partitions = input_bag.npartitions
        grouped = (input_bag.repartition(min(partitions, SHUFFLE_PARTITIONS))
                   .groupby(_key, shuffle="tasks").map(_grouped))
        return grouped.repartition(partitions)


def _key(item):
    return item[0]


def _grouped(group):
    key, items = group
    return key, [beam_ops.defenestrate(item[1]) for item in items]


class _Flatten(beam_ops.Flatten):
    """Beam's Flatten (Bag concat), keeping the largest input's partition count: concatenating them all
    would multiply the partitions, and so the tasks, at every Flatten downstream."""

    def apply(self, input_bag, side_inputs=None):
        return concat(input_bag).repartition(max(bag.npartitions for bag in input_bag))


class _ParDo(beam_ops.DaskBagOp):
    """A ParDo over each partition as one bundle; outputs are (tag, value), tag None for the main one."""

    def apply(self, input_bag, side_inputs=None):
        transform = self.transform
        args, kwargs = transform.raw_side_inputs
        main_input = next(iter(self.applied.main_inputs.values()))
        window_fn = main_input.windowing.windowfn if hasattr(main_input, "windowing") else None
        fn = pickler.dumps(transform.fn)  # each worker thread unpickles its own DoFn instance
        return input_bag.map_partitions(_run_bundle, fn, window_fn, transform.label, list(args), kwargs,
                                        side_inputs)


class _Outputs(dict):
    """tag -> a receiver appending (tag, value) to one list, for one bundle."""

    def __init__(self):
        super().__init__()
        self.values: list = []

    def __missing__(self, tag):
        receiver = self[tag] = _TagReceiver(tag, self.values)
        return receiver


class _TagReceiver(Receiver):
    def __init__(self, tag: str | None, values: list):
        self.tag, self.values = tag, values

    def receive(self, windowed_value) -> None:
        self.values.append((self.tag, windowed_value.value))


# DoFn instances a worker thread keeps between bundles, as Beam's own workers do (setup once, then
# start_bundle .. finish_bundle per bundle): building one (unpickling, DoFnSignature's inspection)
# cost ~1.5 ms for each of a run's thousands of bundles. Bounded, for a long-lived cluster that
# serves many runs; an evicted instance is torn down.
CACHED_DOFNS = 64
_dofns = threading.local()


def _signature(fn: bytes) -> DoFnSignature:
    cache = getattr(_dofns, "cache", None)
    if cache is None:
        cache = _dofns.cache = collections.OrderedDict()
    signature = cache.get(fn)
    if signature is None:
        signature = cache[fn] = DoFnSignature(pickler.loads(fn))
        signature.do_fn.setup()
        if len(cache) > CACHED_DOFNS:
            cache.popitem(last=False)[1].do_fn.teardown()
    cache.move_to_end(fn)
    return signature


def _run_bundle(items, fn, window_fn, label, args, kwargs, side_inputs):
    outputs = _Outputs()
    handler = _OutputHandler(window_fn=window_fn, main_receivers=outputs[None], tagged_receivers=outputs,
                             per_element_output_counter=None, output_batch_converter=None,
                             process_yields_batches=False, process_batch_yields_elements=False)
    invoker = DoFnInvoker.create_invoker(
        _signature(fn), handler, context=DoFnContext(label, state=None),
        side_inputs=side_inputs, input_args=args, input_kwargs=kwargs, user_state_context=None,
        bundle_finalizer_param=beam.DoFn.BundleFinalizerParam())
    invoker.invoke_start_bundle()
    for item in items:
        invoker.invoke_process(beam_ops.get_windowed_value(item, window_fn))
    invoker.invoke_finish_bundle()
    return outputs.values
