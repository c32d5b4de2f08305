from jaxstale._program import run_as_program

from . import main

run_as_program(main)
