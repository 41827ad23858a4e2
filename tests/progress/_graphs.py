"""Progress graphs the tests share: the seed's loop, two nested loops, a plain pipeline."""

from slashrt.progress.reachability import Builder
from slashrt.testing._check_progress import loop_graph


def loop():
    """source -> ingress -> body(in0); body -> feedback -> body(in1); body -> egress -> sink
    (the seed's loop, which the progress bus's conformance check runs on too)."""
    return loop_graph()


def nested_loops():
    """Two loops, the inner one inside the outer one's body:

    source -> in_o -> outer(in0) ; outer -> in_i -> inner(in0) ; inner -> fb_i -> inner(in1)
    inner -> eg_i -> outer_tail ; outer_tail -> fb_o -> outer(in1) ; outer_tail -> eg_o -> sink
    """
    b = Builder()
    n = {}
    n["source"] = b.add_node("source", 0, 1)
    n["in_o"] = b.add_ingress("in_o")
    n["outer"] = b.add_node("outer", 2, 1)
    n["in_i"] = b.add_ingress("in_i")
    n["inner"] = b.add_node("inner", 2, 1)
    n["fb_i"] = b.add_feedback("fb_i")
    n["eg_i"] = b.add_egress("eg_i")
    n["outer_tail"] = b.add_node("outer_tail")
    n["fb_o"] = b.add_feedback("fb_o")
    n["eg_o"] = b.add_egress("eg_o")
    n["sink"] = b.add_node("sink", 1, 0)
    b.connect(n["source"], 0, n["in_o"])
    b.connect(n["in_o"], 0, n["outer"], 0)
    b.connect(n["outer"], 0, n["in_i"])
    b.connect(n["in_i"], 0, n["inner"], 0)
    b.connect(n["inner"], 0, n["fb_i"])
    b.connect(n["fb_i"], 0, n["inner"], 1)
    b.connect(n["inner"], 0, n["eg_i"])
    b.connect(n["eg_i"], 0, n["outer_tail"])
    b.connect(n["outer_tail"], 0, n["fb_o"])
    b.connect(n["fb_o"], 0, n["outer"], 1)
    b.connect(n["outer_tail"], 0, n["eg_o"])
    b.connect(n["eg_o"], 0, n["sink"])
    return b.build(), n


def pipeline():
    """source -> map -> sink."""
    b = Builder()
    n = {"source": b.add_node("source", 0, 1), "map": b.add_node("map"), "sink": b.add_node("sink", 1, 0)}
    b.connect(n["source"], 0, n["map"])
    b.connect(n["map"], 0, n["sink"])
    return b.build(), n
