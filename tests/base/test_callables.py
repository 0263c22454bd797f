"""An author's hook is called as it was written: with or without its optional last argument."""

from reconcilers._base.callables import positional_count


def test_positional_parameters_are_counted_and_star_args_are_not():
    def desired(obj): ...
    def desired_ctx(obj, ctx): ...
    def keyword_only(obj, *, ctx=None): ...
    def star(obj, *rest): ...

    class Mapper:
        def map(self, obj, lister): ...

    assert [positional_count(f) for f in (desired, desired_ctx, keyword_only, star)] == [
        1, 2, 1, 1]
    assert positional_count(Mapper().map) == 2  # a bound method: self is not asked for
    assert positional_count(lambda obj, lister=None: None) == 2
