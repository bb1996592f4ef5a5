"""Register layouts (layout_cast, print_layout): they say how a warpgroup's
lanes hold an array, never what the array's values are, so they are
identities on values here."""
from pallas_sim.backends.sim.interpret.compiler import rule
from pallas_sim.backends.sim.timing.model import OpClass


def _layout_cast(eqn, cx):
  return lambda wg, x: x


# (a layout cast says which registers hold what: no vector work; a
# relayout moves elements between lanes)
rule("layout_cast", op=OpClass.SHAPE_ONLY)(_layout_cast)
rule("relayout")(_layout_cast)


@rule("print_layout")
def _print_layout(eqn, cx):
  return lambda wg, *xs: []
