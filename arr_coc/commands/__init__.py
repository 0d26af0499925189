"""
The commands, each with one dataclass config whose fields are its flags (arr_coc.flags.flag), and what they share:
docs.py generates docs/commands.md's flag tables from those configs.

    python -m arr_coc.commands.docs --write     # docs/commands.md's tables, from the configs
"""
