"""Sphinx configuration: numpydoc API reference, Markdown pages (MyST), the pydata theme and
a sphinx-gallery of the example scripts. Build: ``pip install -e ".[docs]"`` then
``sphinx-build -W -b html docs docs/_build/html``."""

import vsbayes

project = "vsbayes"
author = "the vsbayes developers"
copyright = "2026, the vsbayes developers"
release = version = vsbayes.__version__

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx_gallery.gen_gallery",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "auto_examples/*.ipynb", "auto_examples/*.py", "**.zip"]

autosummary_generate = True
templates_path = ["_templates"]
autodoc_default_options = {"inherited-members": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
myst_heading_anchors = 3

html_theme = "pydata_sphinx_theme"
html_title = f"vsbayes {version}"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}
# Pages without sub-pages have no left sidebar (the theme would show an empty "Section
# Navigation"), so their tables and plots get the width. Wide tables scroll sideways inside
# their column with a visible cue: _static/custom.css, _static/tables.js.
html_sidebars = {
    page: []
    for page in (
        "guide",
        "which_method",
        "estimators",
        "engine",
        "benchmarks",
        "developer",
        "decisions",
        "differences",
    )
}
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_js_files = ["tables.js"]

sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": "/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
}
