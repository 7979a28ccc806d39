"""A learner's Triton kernel, taken from the cell's text: never the host's object.

A kernel exercise's graded name is a plain function in Triton's language (the course's launcher
`engine.attention.triton_decode.as_kernel` makes it a kernel with triton.jit). The judge takes the
function's last `def` of that name out of the learner cell's text, with the cell's top-level number
constants (a kernel reads them as constexprs, `NAME: tl.constexpr = 1.5` too) and its @triton.jit
helpers, and builds and launches it in the kernel process
(engine.course.grading.sealed.kernelbox), never in the judge. Nothing reads the text for what it may do:
the kernel process holds nothing of value and is confined like the host. What the host holds under the
kernel's name (whatever it is, "indexed by a grid" or not) is never launched.
"""
from __future__ import annotations

import ast


def _number(value) -> bool:
    """Whether an expression is a number written out (a constant a kernel may read)."""
    return isinstance(value, ast.Constant) and type(value.value) in (int, float, bool)


def _constants(tree: ast.Module) -> dict:
    """The cell's top-level NAME = number assignments (a kernel may read them as constexprs)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and _number(node.value):
            found[node.targets[0].id] = node.value.value
    return found


def kernel_text(name: str, source: str):
    """((the def of kernel `name` as `source` writes it, undecorated; the cell's number constants), '')
    or (None, why not). Nothing of it runs here: the kernel process builds and launches it."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as error:
        return None, f"its cell does not parse ({error})"
    definitions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not definitions:
        return None, f"{name} is not a function written with def in your cell"
    definition = definitions[-1]
    definition.decorator_list = []        # the launcher jits it; any other decorator is not the kernel
    helpers = [_as_jitted(n) for n in tree.body if isinstance(n, ast.FunctionDef) and n.name != name
               and any("jit" in ast.unparse(d) for d in n.decorator_list)]
    annotated = [n for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                 and _number(n.value)]
    text = "".join(ast.unparse(n) + "\n\n" for n in [*annotated, *helpers, definition])
    return (text, _constants(tree)), ""


def _as_jitted(helper: ast.FunctionDef) -> ast.FunctionDef:
    """A @triton.jit helper of the cell (`@jit`, `@triton.jit(...)`), as the kernel process's triton jits it."""
    helper.decorator_list = [ast.parse("triton.jit", mode="eval").body]
    return helper
