"""A learner's Triton kernel, taken from the cell's text: never the host's object.

A kernel exercise's graded name is a plain function in Triton's language (the course's launcher
`engine.attention.triton_decode.as_kernel` makes it a kernel with triton.jit). The judge takes the
function's definition out of the learner cell's syntax tree and checks that it is kernel code and
nothing else (arithmetic, comparisons, loops and branches over its arguments and locals, `tl.*` and
`triton.*`, a few builtins, the cell's own integer constants): a first screen, not the boundary. The
kernel is built and launched in the kernel process (engine.course.grading.sealed.kernelbox), never in the
judge; what the host holds under that name (whatever it is, "indexed by a grid" or not) is never
launched.
"""
from __future__ import annotations

import ast

BUILTINS = ("range", "min", "max", "float", "int", "bool", "len", "abs")
# Attributes a kernel's values (Triton tensors) may be asked for: what kernels use, nothing that
# reaches the arrays or pointers behind them.
VALUE_ATTRIBUTES = {"to", "T", "dtype", "element_ty", "shape", "ndim", "numel", "type", "reshape", "view",
                    "broadcast_to", "trans", "permute", "expand_dims", "ravel", "flip", "split", "join", "sum",
                    "max", "min", "argmax", "argmin", "cumsum", "exp", "exp2", "log", "sqrt", "abs",
                    "sigmoid", "cast", "value", "logical_and", "logical_or"}
ROOTS = ("tl", "triton")
TRITON_FUNCTIONS = {"cdiv", "next_power_of_2", "constexpr", "jit"}
NODES = (ast.FunctionDef, ast.arguments, ast.arg, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.While,
         ast.If, ast.Return, ast.Expr, ast.Pass, ast.Break, ast.Continue, ast.Compare, ast.BinOp, ast.UnaryOp,
         ast.BoolOp, ast.IfExp, ast.Call, ast.Name, ast.Attribute, ast.Subscript, ast.Slice, ast.Tuple,
         ast.List, ast.Constant, ast.keyword, ast.operator, ast.unaryop, ast.cmpop, ast.boolop,
         ast.expr_context)


def _constants(tree: ast.Module) -> dict:
    """The cell's top-level NAME = number assignments (a kernel may read them as constexprs)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Constant) and type(node.value.value) in (int, float, bool):
            found[node.targets[0].id] = node.value.value
    return found


def _refusal(definition: ast.FunctionDef, allowed: set[str]) -> str:
    """What in the definition is not kernel code ('' when nothing)."""
    for decorator in definition.decorator_list:
        if ast.unparse(decorator).split("(")[0] not in ("triton.jit", "jit"):
            return f"it is decorated with {ast.unparse(decorator)}"
    local = {a.arg for a in definition.args.args + definition.args.kwonlyargs + definition.args.posonlyargs}
    local |= {n.id for n in ast.walk(definition) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for node in ast.walk(definition):
        if node in definition.decorator_list or any(node is n for d in definition.decorator_list for n in ast.walk(d)):
            continue
        if not isinstance(node, NODES):
            return f"it uses {type(node).__name__}, which is not kernel code"
        if isinstance(node, ast.FunctionDef) and node is not definition:
            return "it defines a function inside"
        if isinstance(node, ast.Name) and node.id not in local | allowed:
            return f"it reads {node.id}, which is neither its own, tl, triton nor a constant of the cell"
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                return f"it reads .{node.attr}"
            root = node.value
            if isinstance(root, ast.Name) and root.id == "triton" and node.attr not in TRITON_FUNCTIONS:
                return f"it reads triton.{node.attr}"
            if isinstance(root, ast.Name) and root.id not in ROOTS and node.attr not in VALUE_ATTRIBUTES:
                return f"it reads .{node.attr} of a value"
            if isinstance(root, ast.Attribute) and not (isinstance(root.value, ast.Name) and root.value.id == "tl"
                                                        and root.attr == "math"):
                if node.attr not in VALUE_ATTRIBUTES:
                    return f"it reads .{node.attr}"
    return ""


def build(name: str, source: str):
    """(the kernel `name` as `source` defines it: a kernelbox.Program, '') or (None, why not). Nothing of
    it runs here: the kernel process (engine.course.grading.sealed.kernelbox) builds and launches it."""
    from engine.course.grading.sealed.kernelbox import Program
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as error:
        return None, f"its cell does not parse ({error})"
    definitions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not definitions:
        return None, f"{name} is not a function written with def in your cell"
    definition = definitions[-1]
    constants = _constants(tree)
    why = _refusal(definition, set(ROOTS) | set(BUILTINS) | set(constants))
    if why:
        return None, f"your kernel {name} is not plain Triton code: {why}"
    definition.decorator_list = []
    return Program(name, ast.unparse(definition) + "\n", constants), ""
